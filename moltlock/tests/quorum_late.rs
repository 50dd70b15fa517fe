//! A quorum starts while a minority of its stores is down: the down member
//! joins once its store answers. A majority down, or a member URL that is
//! wrong rather than unreachable, fails the connect.
#![cfg(all(feature = "redis", feature = "sqlite"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::time::Duration;

use moltlock::{Error, LockKey, LockManager};
use tokio::time::Instant;

fn sqlite(dir: &std::path::Path, name: &str) -> String {
    format!("sqlite://{}", dir.join(name).display())
}

#[tokio::test]
async fn a_member_down_at_connect_joins_when_its_store_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = moltlock_fixtures::redis::start_owned().unwrap();
    let member = redis.url();
    redis.server.kill();
    let url = format!(
        "quorum:{}|{}|{member}",
        sqlite(dir.path(), "a.db"),
        sqlite(dir.path(), "b.db")
    );
    let manager = LockManager::new(moltlock::connect(&url).await.unwrap());
    let first = manager.lock("late/first").await.unwrap();
    first.release().await.unwrap();

    redis.restart().unwrap();
    let direct = moltlock::connect(&member).await.unwrap();
    let inspector = direct.inspector().unwrap();
    let until = Instant::now() + Duration::from_secs(15);
    let mut joined = false;
    let mut round = 0;
    while !joined && Instant::now() < until {
        round += 1;
        let k = format!("late/after-{round}");
        let guard = manager.lock(&k).await.unwrap();
        let there = inspector.inspect(&LockKey::new(k).unwrap()).await.unwrap();
        joined = there.is_some_and(|h| &h.holder == guard.token());
        guard.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(joined, "the member that came back never held a quorum lock");
}

#[tokio::test]
async fn a_majority_down_or_a_wrong_member_url_fails_the_connect() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = moltlock_fixtures::redis::start_owned().unwrap();
    let member = redis.url();
    redis.server.kill();
    let two_down = format!("quorum:{}|{member}|{member}", sqlite(dir.path(), "a.db"));
    let err = moltlock::connect(&two_down)
        .await
        .err()
        .expect("connected without a majority");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let wrong = format!(
        "quorum:{}|{}|postgres:/nohost",
        sqlite(dir.path(), "a.db"),
        sqlite(dir.path(), "b.db")
    );
    let err = moltlock::connect(&wrong)
        .await
        .err()
        .expect("a wrong URL connected");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}
