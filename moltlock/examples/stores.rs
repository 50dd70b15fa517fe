//! What a store offers MoltLock and how fast it is here (docs/STORES.md):
//! run it against each store you consider, with the URL in MOLTLOCK_URL.
//!
//! ```sh
//! cargo run -p moltlock --example stores                   # an SQLite file
//! MOLTLOCK_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run -p moltlock --features postgres --example stores
//! ```

use std::time::Instant;

use moltlock::{Error, LockManager};

/// Lock-release cycles to time.
const CYCLES: usize = 200;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("MOLTLOCK_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("locks.db").display()));
    let manager = LockManager::new(moltlock::connect(&url).await?);
    let b = manager.backend();
    let limits = b.limits();
    let yes = |on: bool| if on { "yes" } else { "no" };
    println!("store:                        {}", b.name());
    println!("shortest TTL:                 {:?}", limits.min_ttl);
    println!("longest key:                  {} bytes", limits.max_key_len);
    println!(
        "release notifications:        {}",
        match b.watcher() {
            Some(_) => "yes (waiters wake on release)",
            None => "no (waiters poll by the retry policy)",
        }
    );
    println!(
        "fair (arrival-order) queue:   {}",
        yes(b.fair_queue().is_some())
    );
    println!(
        "several keys in one request:  {}",
        yes(b.batch_cas().is_some())
    );
    println!(
        "renews all holds in one trip: {}",
        yes(b.renewer().is_some())
    );
    println!(
        "lists holders (status):       {}",
        yes(b.inspector().is_some())
    );

    let key = format!("stores-example/{}", std::process::id());
    let mut took = Vec::with_capacity(CYCLES);
    let mut fences = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let start = Instant::now();
        let guard = manager.lock(&key).await?;
        fences.push(guard.fence());
        guard.release().await?;
        took.push(start.elapsed());
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "lock + release:               p50 {:?}, p99 {:?} ({CYCLES} cycles)",
        at(0.5),
        at(0.99)
    );
    if fences.windows(2).any(|w| w[1] <= w[0]) {
        return Err(Error::Config("fences did not rise from hold to hold".into()).into());
    }
    println!(
        "fences rose from hold to hold: {} … {}",
        fences[0],
        fences[CYCLES - 1]
    );
    Ok(())
}
