//! The fair queue's places on Redis: a waiter that stops looking (a crash)
//! is passed once its place's deadline is over.

use std::time::Duration;

use moltlock_core::{Backend, LockKey, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fair_waiter_is_passed_after_its_ttl() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("fair/crashed")?;
    let holder = Token::random();
    backend
        .cas(&key, None, &holder, Duration::from_secs(10))
        .await?;
    crash_in_queue(&backend, &key).await?;

    let (b, k) = (backend.clone(), key.clone());
    let second = tokio::spawn(async move {
        let token = Token::random();
        let fence = b
            .fair_queue()
            .ok_or("no fair queue")?
            .acquire(&k, &token, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((token, fence))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(backend.delete(&key, &holder).await?);
    // The crashed place is at the head for at most its 1 s TTL.
    let (token, _) = tokio::time::timeout(Duration::from_secs(3), second)
        .await
        .map_err(|_| "the waiter behind a crashed one never got the key")???;
    assert!(backend.delete(&key, &token).await?);
    Ok(())
}

/// A fair waiter whose token already holds the key (an earlier look took it
/// and its reply was lost) is told it holds it, with its fence, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_that_finds_its_own_hold_takes_it() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("fair/own")?;
    let token = Token::random();
    let ttl = Duration::from_secs(30);
    let moltlock_core::CasOutcome::Acquired { fence } =
        backend.cas(&key, None, &token, ttl).await?
    else {
        return Err("a free key was not taken".into());
    };
    let queue = backend.fair_queue().ok_or("no fair queue")?;
    let again = tokio::time::timeout(Duration::from_secs(2), queue.acquire(&key, &token, ttl))
        .await
        .map_err(|_| "the waiter waited behind its own hold")??;
    assert_eq!(again, fence);
    assert!(backend.delete(&key, &token).await?);
    Ok(())
}

/// Fair waiters that arrive during the restart quarantine keep their
/// places: they are served in arrival order once it has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrival_order_holds_through_the_restart_quarantine(
) -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::start_owned()?;
    let url = server.url_with_quarantine(Duration::from_secs(3));
    let backend = RedisBackend::connect(RedisConfig::from_url(&url)?).await?;
    let key = LockKey::new("fair/quarantine")?;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, ttl) in [("first", 3_000), ("second", 300)] {
        let (b, k, order) = (backend.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let token = Token::random();
            let queue = b.fair_queue().ok_or("no fair queue")?;
            queue
                .acquire(&k, &token, Duration::from_millis(ttl))
                .await
                .map_err(|e| e.to_string())?;
            order.lock().map_err(|e| e.to_string())?.push(name);
            b.delete(&k, &token).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t).await???;
    }
    let order = order.lock().map_err(|e| e.to_string())?.clone();
    assert_eq!(order, vec!["first", "second"]);
    Ok(())
}

/// With the shortest TTL a place still outlives the waiter's looks: two
/// fair waiters of 10 ms behind a hold are served in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn places_of_the_shortest_ttl_keep_their_order() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let cfg = RedisConfig::from_url(&server.url())?
        .key_prefix(fx::unique_prefix())
        .fence_retention(Duration::from_secs(60));
    let backend = RedisBackend::connect(cfg).await?;
    let key = LockKey::new("fair/short")?;
    let holder = Token::random();
    backend
        .cas(&key, None, &holder, Duration::from_secs(10))
        .await?;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for name in ["first", "second"] {
        let (b, k, order) = (backend.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let queue = b.fair_queue().ok_or("no fair queue")?;
            queue
                .acquire(&k, &Token::random(), moltlock_redis::MIN_TTL)
                .await
                .map_err(|e| e.to_string())?;
            order.lock().map_err(|e| e.to_string())?.push(name);
            Ok::<_, String>(())
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(backend.delete(&key, &holder).await?);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t).await???;
    }
    let order = order.lock().map_err(|e| e.to_string())?.clone();
    assert_eq!(order, vec!["first", "second"]);
    Ok(())
}

/// A release names the fair queue's head (`fair:<its token>`), which is
/// woken at once: its next look by its own clock would come a third of its
/// 30 s TTL later. The head's own release then names the waiter behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_names_and_wakes_the_fair_head() -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::redis()?;
    let prefix = fx::unique_prefix();
    let open = || async {
        let cfg = RedisConfig::from_url(&server.url())?
            .key_prefix(prefix.clone())
            .fence_retention(Duration::from_secs(60));
        Ok::<_, Box<dyn std::error::Error>>(RedisBackend::connect(cfg).await?)
    };
    let (holder_side, head_side, tail_side) = (open().await?, open().await?, open().await?);
    let key = LockKey::new("fair/named")?;
    let holder = Token::random();
    holder_side
        .cas(&key, None, &holder, Duration::from_secs(30))
        .await?;
    let ttl = Duration::from_secs(30);
    let wait_in = |side: RedisBackend, k: LockKey, token: Token| {
        tokio::spawn(async move {
            let queue = side.fair_queue().ok_or("no fair queue")?;
            queue
                .acquire(&k, &token, ttl)
                .await
                .map_err(|e| e.to_string())
        })
    };
    let (head, tail) = (Token::random(), Token::random());
    let first = wait_in(head_side.clone(), key.clone(), head.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = wait_in(tail_side.clone(), key.clone(), tail.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut pubsub = moltlock_redis::redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    pubsub.psubscribe(format!("{prefix}*")).await?;
    let mut messages = pubsub.into_on_message();
    assert!(holder_side.delete(&key, &holder).await?);
    assert_eq!(
        next_payload(&mut messages).await?,
        format!("fair:{}", head.as_str())
    );
    tokio::time::timeout(Duration::from_secs(2), first)
        .await
        .map_err(|_| "the named head was not woken")???;
    assert!(!second.is_finished(), "the second waiter took a held key");
    assert!(head_side.delete(&key, &head).await?);
    assert_eq!(
        next_payload(&mut messages).await?,
        format!("fair:{}", tail.as_str())
    );
    tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .map_err(|_| "the next head was not woken")???;
    assert!(tail_side.delete(&key, &tail).await?);
    Ok(())
}

/// The next announcement's text, within 2 s.
async fn next_payload(
    messages: &mut (impl futures_util::Stream<Item = moltlock_redis::redis::Msg> + Unpin),
) -> Result<String, Box<dyn std::error::Error>> {
    use futures_util::StreamExt;

    let told = tokio::time::timeout(Duration::from_secs(2), messages.next())
        .await?
        .ok_or("no announcement")?;
    Ok(told.get_payload()?)
}

/// A release that names a head which does not take the key (a crashed
/// waiter's place, dead by then) leaves no waiter behind it to its own
/// clock (a third of its 30 s TTL): a waiter that last looked when it was
/// third takes the key a turn after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_dead_named_head_is_woken_a_turn_later(
) -> Result<(), Box<dyn std::error::Error>> {
    let server = fx::start_owned()?;
    let key = LockKey::new("fair/stale")?;
    let (holder_side, holder) = held(&server, &key).await?;
    let first = fair_wait(RedisBackend::from_url(&server.url()).await?, &key);
    tokio::time::sleep(Duration::from_millis(100)).await;
    crash_in_queue(&RedisBackend::from_url(&server.url()).await?, &key).await?;
    let third = fair_wait(RedisBackend::from_url(&server.url()).await?, &key);
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert!(holder_side.delete(&key, &holder).await?);
    let (side, token, _) = tokio::time::timeout(Duration::from_secs(2), first)
        .await
        .map_err(|_| "the first waiter was not woken")???;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(side.delete(&key, &token).await?);
    let released = tokio::time::Instant::now();
    let (side, token, _) = tokio::time::timeout(Duration::from_secs(3), third)
        .await
        .map_err(|_| "the waiter behind the dead place was not woken")???;
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    assert!(side.delete(&key, &token).await?);
    Ok(())
}

/// The TTL of the holds and places of the tests on a private server.
const LONG_TTL: Duration = Duration::from_secs(30);

/// A backend of its own on `server` holding `key` for [`LONG_TTL`], and
/// the holder's token.
async fn held(
    server: &fx::OwnedRedis,
    key: &LockKey,
) -> Result<(RedisBackend, Token), Box<dyn std::error::Error>> {
    let side = RedisBackend::from_url(&server.url()).await?;
    let holder = Token::random();
    side.cas(key, None, &holder, LONG_TTL).await?;
    Ok((side, holder))
}

/// A fair waiter for `key` on `side` (TTL [`LONG_TTL`]): the backend, its
/// token and fence once it holds the key.
fn fair_wait(
    side: RedisBackend,
    key: &LockKey,
) -> tokio::task::JoinHandle<Result<(RedisBackend, Token, moltlock_core::Fence), String>> {
    let (key, token) = (key.clone(), Token::random());
    tokio::spawn(async move {
        let queue = side.fair_queue().ok_or("no fair queue")?;
        let fence = queue
            .acquire(&key, &token, LONG_TTL)
            .await
            .map_err(|e| e.to_string())?;
        Ok((side, token, fence))
    })
}

/// A fair waiter on `side` takes a place in `key`'s queue with a 1 s TTL,
/// then never looks again and never leaves: its future is leaked, as a
/// crashed process's would be.
async fn crash_in_queue(
    side: &RedisBackend,
    key: &LockKey,
) -> Result<(), Box<dyn std::error::Error>> {
    let queue = side.fair_queue().ok_or("no fair queue")?;
    let token = Token::random();
    let mut place = Box::pin(queue.acquire(key, &token, Duration::from_secs(1)));
    let early = tokio::time::timeout(Duration::from_millis(200), &mut place).await;
    assert!(early.is_err(), "a fair waiter took a held key");
    std::mem::forget(place);
    Ok(())
}
