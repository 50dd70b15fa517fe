//! Release wake-ups: with 8 tasks contending on one key and a 1 s retry
//! delay, the next holder follows a release within milliseconds (a sanity
//! bound, not a benchmark: polling could not explain it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{LockManager, LockOptions, RetryPolicy, Turns};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{redis, RedisBackend, RedisConfig};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_waiters_wake_on_release() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(600));
    let backend = RedisBackend::connect(cfg).await?;
    let manager = LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_secs(1)))
        .build()?;
    // The instant the last holder sent its release.
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let gaps: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (m, last, gaps) = (manager.clone(), last_release.clone(), gaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let g = m.lock("wakeup/contended").await?;
                let acquired = Instant::now();
                if let Some(at) = last.lock().map_err(|e| e.to_string())?.take() {
                    gaps.lock().map_err(|e| e.to_string())?.push(acquired - at);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                *last.lock().map_err(|e| e.to_string())? = Some(Instant::now());
                g.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let mut gaps = gaps.lock().map_err(|e| e.to_string())?.clone();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    println!(
        "hand-over gaps: median {median:?}, max {:?}, n {}",
        gaps.last(),
        gaps.len()
    );
    assert!(gaps.len() >= 30, "only {} hand-overs", gaps.len());
    assert!(median < Duration::from_millis(50), "median {median:?}");
    Ok(())
}

/// A release publishes only when a waiter marked the key: nothing for a
/// release nobody waits for; an announcement for one a waiter waits for,
/// also when the hold was renewed for longer than the waiter's first mark
/// lasts (the waiter marks again as it looks again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_publish_only_when_someone_waits() -> Result<(), Box<dyn std::error::Error>> {
    use futures_util::StreamExt;

    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let open = || async {
        let cfg = RedisConfig::from_url(&server.url())?
            .key_prefix(prefix.clone())
            .fence_retention(Duration::from_secs(600));
        let backend = RedisBackend::connect(cfg).await?;
        let manager = LockManager::builder(backend)
            .ttl(Duration::from_millis(500))
            .retry(RetryPolicy::Fixed(Duration::from_secs(60)))
            .build()?;
        Ok::<_, Box<dyn std::error::Error>>(manager)
    };
    let (holder, waiter) = (open().await?, open().await?);
    let mut pubsub = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    pubsub.psubscribe(format!("{prefix}*")).await?;
    let mut messages = pubsub.into_on_message();

    holder.lock("publish/k").await?.release().await?;
    let quiet = tokio::time::timeout(Duration::from_millis(300), messages.next()).await;
    assert!(quiet.is_err(), "a release nobody waited for published");

    let g = holder.lock("publish/k").await?;
    let task = tokio::spawn(async move { waiter.lock("publish/k").await });
    // Past the first mark (the hold's 500 ms and 5 s): renewed all along.
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert!(!task.is_finished(), "the waiter took a held key");
    g.release().await?;
    let told = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
    assert!(
        matches!(told, Ok(Some(_))),
        "a release a waiter waited for was not announced"
    );
    let next = tokio::time::timeout(Duration::from_secs(5), task).await???;
    next.release().await?;
    Ok(())
}

/// Whoever inspects a held key and then waits on its release watch (an
/// election's observer does) is told of the release, though it never tried
/// to take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inspecting_watcher_hears_the_release() -> Result<(), Box<dyn std::error::Error>> {
    use moltlock_core::{Backend, Held, Inspect, LockKey, Token, Watch};

    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("observed")?;
    let holder = Token::random();
    backend
        .cas(&key, None, &holder, Duration::from_secs(30))
        .await?;
    let mut watch = Watch::watch(&backend, &key).await?;
    let info = Inspect::inspect(&backend, &key).await?.ok_or("no holder")?;
    let held = Held {
        holder: Some(info.holder),
        expires_in: info.expires_in,
        revision: None,
    };
    let b = backend.clone();
    let k = key.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.delete(&k, &holder).await
    });
    tokio::time::timeout(Duration::from_secs(3), watch.released(&held))
        .await
        .map_err(|_| "the release was not announced to an inspecting watcher")??;
    Ok(())
}

/// A manager over a backend of its own, as each process has, on `prefix`.
async fn instance(
    server: &fx::RedisServer,
    prefix: &str,
) -> Result<LockManager, Box<dyn std::error::Error>> {
    instance_with(server, prefix, true).await
}

/// As [`instance`], with the backend's turns on or off.
async fn instance_with(
    server: &fx::RedisServer,
    prefix: &str,
    turns: bool,
) -> Result<LockManager, Box<dyn std::error::Error>> {
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(prefix)
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    backend.set_turns(turns);
    Ok(LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_secs(1)))
        .build()?)
}

/// With a backend (as a process has) per contender, a releaser that asks
/// for the key again at once reaches the server before the waiter its
/// release woke, and would win nearly every time. A release the others
/// waited for hands the next turn to a waiting instance drawn at random,
/// so each of four contenders gets at least a quarter of a fair share, the
/// bound for "no starvation" (without turns the least served gets under
/// 1 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiting_instance_gets_turns() -> Result<(), Box<dyn std::error::Error>> {
    const CONTENDERS: usize = 4;
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let manager = instance(&server, &prefix).await?;
        tasks.push(tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(2);
            let mut won = 0_usize;
            while Instant::now() < end {
                let g = manager.lock("turns/contended").await?;
                won += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.release().await?;
            }
            Ok::<_, moltlock_core::Error>(won)
        }));
    }
    let mut shares = Vec::new();
    for t in tasks {
        shares.push(t.await??);
    }
    let total: usize = shares.iter().sum();
    let least = shares.iter().copied().min().unwrap_or(0);
    println!("acquisitions per contender: {shares:?}");
    assert!(total >= 100, "only {total} acquisitions in 2 s");
    assert!(
        least * CONTENDERS * 4 >= total,
        "a contender starved: {shares:?}"
    );
    Ok(())
}

/// A turn is kept only for an instance that waits: a `try_lock` that found
/// the key held joins no turn, so the release leaves the key free for
/// anyone at once; and a turn drawn for a waiter that gave up just before
/// the release keeps the key from others only briefly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_go_only_to_waiters_and_lapse() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let (holder, other, third) = (
        instance(&server, &prefix).await?,
        instance(&server, &prefix).await?,
        instance(&server, &prefix).await?,
    );
    let g = holder.lock("turns/k").await?;
    assert!(other.try_lock("turns/k").await?.is_none());
    g.release().await?;
    let free = third.try_lock("turns/k").await?;
    assert!(
        free.is_some(),
        "a try_lock's failed attempt reserved a turn"
    );
    drop(free);

    let g = holder.lock("turns/k").await?;
    let gave_up = other
        .lock_timeout("turns/k", Duration::from_millis(300))
        .await;
    assert!(gave_up.is_err(), "the waiter took a held key");
    g.release().await?;
    assert!(
        third.try_lock("turns/k").await?.is_none(),
        "the release handed no turn to the instance that had waited"
    );
    let late = tokio::time::timeout(Duration::from_secs(2), third.lock("turns/k")).await;
    assert!(
        matches!(late, Ok(Ok(_))),
        "a turn for a waiter that gave up kept the key"
    );
    Ok(())
}

/// A backend with turns off (as a quorum's Redis member is) neither joins
/// a key's turns nor has a release keep the key for it: after its waiter
/// waited, the release leaves the key free for anyone at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_without_turns_is_never_handed_one() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let waiter = instance_with(&server, &prefix, false).await?;
    let (holder, third) = (
        instance(&server, &prefix).await?,
        instance(&server, &prefix).await?,
    );
    let g = holder.lock("noturns/k").await?;
    let gave_up = waiter
        .lock_timeout("noturns/k", Duration::from_millis(300))
        .await;
    assert!(gave_up.is_err(), "the waiter took a held key");
    g.release().await?;
    assert!(
        third.try_lock("noturns/k").await?.is_some(),
        "a release kept the key for an instance with turns off"
    );
    Ok(())
}

/// A manager over a backend of its own whose retry policy would not look
/// again for 10 s: only a wake-up serves it.
async fn woken_only(
    server: &fx::RedisServer,
    prefix: &str,
) -> Result<LockManager, Box<dyn std::error::Error>> {
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(prefix)
        .fence_retention(Duration::from_secs(60));
    Ok(LockManager::builder(RedisBackend::connect(cfg).await?)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_secs(10)))
        .build()?)
}

type Stream = Vec<tokio::task::JoinHandle<Result<usize, moltlock_core::Error>>>;

/// A task per manager taking `key` (fair or plain), holding it 1 ms and
/// asking again at once, until `stop`; each counts its holds.
fn hand_offs(managers: Vec<LockManager>, key: &'static str, fair: bool, stop: Instant) -> Stream {
    let opts = match fair {
        true => LockOptions::new().fair(),
        false => LockOptions::new(),
    };
    managers
        .into_iter()
        .map(|m| {
            let opts = opts.clone().timeout(Duration::from_secs(10));
            tokio::spawn(async move {
                let mut held = 0_usize;
                while Instant::now() < stop {
                    let Some(g) = m.acquire(key, opts.clone()).await? else {
                        break;
                    };
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    g.release().await?;
                    held += 1;
                }
                Ok(held)
            })
        })
        .collect()
}

/// Checks that every task of `stream` held its key more than ten times.
async fn busy(stream: Stream) -> Result<(), Box<dyn std::error::Error>> {
    for s in stream {
        assert!(s.await?? > 10, "the hand-offs were not busy");
    }
    Ok(())
}

/// A plain waiter beside a busy fair queue is never drawn (a queue with
/// places draws no turns), and the key is free only between a release
/// and the next head's take. The queue's namings of its heads wake the
/// plain waiter a turn after the first, however many follow, so it looks
/// in those gaps and gets the key; its retry policy alone would not look
/// again for 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_waiter_beside_a_busy_fair_queue_gets_the_key(
) -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let fair = instance(&server, &prefix).await?;
    let plain = woken_only(&server, &prefix).await?;
    let stop = Instant::now() + Duration::from_secs(5);
    let stream = hand_offs(vec![fair.clone(), fair], "fairstream/k", true, stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = plain
        .lock_timeout("fairstream/k", Duration::from_secs(3))
        .await;
    assert!(Instant::now() < stop, "the fair queue stopped first");
    let Ok(g) = got else {
        return Err("a plain waiter beside a busy fair queue never got the key".into());
    };
    g.release().await?;
    busy(stream).await
}

/// A multi-key take joins no key's turns, so it is never drawn, and the
/// key is free for it only between a release and the drawn instance's
/// take. The turns handed to the single-key instances wake it a turn
/// after the first, however many follow, so it looks in those gaps and
/// gets its keys; its retry policy alone would not look again for 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_waiter_beside_a_stream_of_turns_gets_its_keys(
) -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let mut plain = Vec::new();
    for _ in 0..3 {
        plain.push(instance(&server, &prefix).await?);
    }
    let multi = woken_only(&server, &prefix).await?;
    let stop = Instant::now() + Duration::from_secs(5);
    let stream = hand_offs(plain, "turnstream/k", false, stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let opts = LockOptions::new().timeout(Duration::from_secs(3));
    let got = multi
        .lock_all(["turnstream/k", "turnstream/k2"], opts)
        .await;
    assert!(Instant::now() < stop, "the turns stopped first");
    let Ok(g) = got else {
        return Err("a multi-key waiter beside a stream of turns never got its keys".into());
    };
    g.release().await?;
    busy(stream).await
}

/// A waiter whose attempt joined the key's turns is not woken by each run
/// of turns handed to other instances: it looks when they stop for a turn
/// or every 100 ms. Here announcements of others' turns (sent by hand,
/// every 2 ms for 300 ms, while the key stays held) wake it at most a few
/// times; a waiter woken a turn after each first announcement would look
/// about fifteen times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_the_turns_sleeps_through_others_turns(
) -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::start_owned()?;
    let prefix = "sleeps:";
    let holder = LockManager::builder(
        RedisBackend::connect(RedisConfig::from_url(&server.url())?.key_prefix(prefix)).await?,
    )
    .ttl(Duration::from_secs(30))
    .build()?;
    let cfg = RedisConfig::from_url(&server.url())?.key_prefix(prefix);
    let waiter = LockManager::builder(RedisBackend::connect(cfg).await?)
        .ttl(Duration::from_secs(30))
        .retry(RetryPolicy::Fixed(Duration::from_secs(10)))
        .build()?;
    let g = holder.lock("k").await?;
    let waiting = tokio::spawn(async move { waiter.lock("k").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = redis::Client::open(server.raw_url())?;
    let mut raw = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut raw)
        .await?;
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(format!("{prefix}{{k}}"))
            .arg("turn:another-instance")
            .query_async(&mut raw)
            .await?;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await?;
    let looks = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(Ok(0), str::parse::<u64>)?;
    assert!(looks <= 5, "the waiter looked {looks} times: {stats}");
    g.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await??;
    got?.release().await?;
    Ok(())
}
