//! What a TTL and the drift allowance mean for a holder (docs/TTL.md):
//! renewal every TTL/3, local validity `ttl × (1 − drift)` from the send of
//! the request that confirmed the hold, and what a pause longer than that
//! does: the holder's own view ends, `lost()` fires, and the next holder
//! gets a higher fence.
//!
//! The pause is real: the example blocks its only runtime thread, as a
//! stop-the-world GC pause or a SIGSTOP would, so the renewal task cannot
//! run either.
//!
//! ```sh
//! cargo run -p moltlock --example ttl              # an SQLite file
//! MOLTLOCK_URL=etcd://127.0.0.1:2379 cargo run -p moltlock --features etcd --example ttl
//! ```

use std::time::{Duration, Instant};

use moltlock::{Error, LockManager};

/// Short, so the example is quick; 2 s is also etcd's shortest TTL.
const TTL: Duration = Duration::from_secs(2);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("MOLTLOCK_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("locks.db").display()));
    let manager = LockManager::builder(moltlock::connect(&url).await?)
        .ttl(TTL)
        .drift(0.02)
        .build()?;

    let guard = manager.lock("jobs/ttl-demo").await?;
    println!(
        "held with fence {}; TTL {:?}, trusted for {:?} more (TTL × 0.98 from the send)",
        guard.fence(),
        guard.ttl(),
        guard.valid_for().unwrap_or_default()
    );

    // Working normally: renewals every TTL/3 keep the hold valid.
    for step in 1..=3 {
        tokio::select! {
            reason = guard.lost() => return Err(format!("lost early: {reason}").into()),
            () = tokio::time::sleep(TTL / 2) => {}
        }
        // Check right before each write, and send the fence with it.
        let fence = guard.check()?;
        println!(
            "step {step}: still held (fence {fence}, {:?} left)",
            guard.valid_for().unwrap_or_default()
        );
    }

    // A pause longer than the TTL: nothing in this process runs.
    let paused = Instant::now();
    std::thread::sleep(TTL + TTL / 2);
    println!("paused for {:?}", paused.elapsed());

    // On waking, the holder knows at once that it may no longer write.
    match guard.check() {
        Err(Error::Lost { reason, .. }) => println!("after the pause: not held ({reason})"),
        Ok(fence) => return Err(format!("still trusted after the pause (fence {fence})").into()),
        Err(e) => return Err(e.into()),
    }
    println!("lost() says: {}", guard.lost().await);

    // The store expired the hold too, so another holder gets it, with a
    // higher fence that the resource can tell from the old one.
    let next = manager.lock("jobs/ttl-demo").await?;
    println!("next holder: fence {}", next.fence());
    if next.fence() <= guard.fence() {
        return Err("the next fence is not higher".into());
    }
    next.release().await?;
    // The first hold is long gone: releasing it says so.
    match guard.release().await {
        Err(Error::NotHeld { .. } | Error::Lost { .. }) | Ok(()) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
