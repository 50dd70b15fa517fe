//! The same application code on any store: the URL picks the backend at run
//! time, and cargo features decide which backends are compiled in.
//!
//! ```sh
//! cargo run -p moltlock --example swap                                    # SQLite file
//! cargo run -p moltlock --features redis --example swap -- redis://127.0.0.1:6379/
//! cargo run -p moltlock --features postgres --example swap -- postgres://postgres@127.0.0.1/test
//! ```

use std::time::Duration;

use moltlock::{Error, LockManager};

/// Application code: knows nothing about the store behind the manager.
async fn nightly_report(manager: &LockManager) -> Result<(), Error> {
    let Some(guard) = manager.try_lock("jobs/nightly-report").await? else {
        println!("another node is running the report");
        return Ok(());
    };
    println!("running the report with fence {}", guard.fence());
    tokio::select! {
        reason = guard.lost() => println!("lost the lock ({reason}); stopping"),
        _ = tokio::time::sleep(Duration::from_millis(200)) => println!("report done"),
    }
    guard.release().await
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("MOLTLOCK_URL").ok())
        .unwrap_or_else(|| "sqlite://moltlock-example.db".to_owned());
    let manager = moltlock::manager(&url).await?;
    println!("store: {}", manager.backend().name());
    nightly_report(&manager).await
}
