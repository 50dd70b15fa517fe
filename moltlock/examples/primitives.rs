//! Semaphores, read-write locks and multi-locks, as the README shows them,
//! on any store.
//!
//! ```sh
//! cargo run -p moltlock --example primitives                              # SQLite file
//! cargo run -p moltlock --features redis --example primitives -- redis://127.0.0.1:6379/
//! ```

use std::time::Duration;

use moltlock::{Error, LockManager, LockOptions, RwOptions};

/// At most 4 encoders at once.
async fn encode(manager: &LockManager) -> Result<(), Error> {
    let encoders = manager.semaphore("video/encoders", 4)?;
    let permit = encoders.acquire().await?;
    println!("slot {} fence {}", permit.slot(), permit.fence());
    permit.release().await
}

/// Many readers or one writer.
async fn config(manager: &LockManager) -> Result<(), Error> {
    let lock = manager.rw_lock("config/routes", RwOptions::new().readers(8))?;
    let read = lock.read().await?;
    read.release().await?;
    let write = lock.write().await?;
    println!("writer fence {}", write.fence());
    write.release().await
}

/// Two keys, all or nothing.
async fn transfer(manager: &LockManager) -> Result<(), Error> {
    let opts = LockOptions::new().timeout(Duration::from_secs(5));
    let both = manager
        .lock_all(["accounts/42", "accounts/7"], opts)
        .await?;
    for (key, fence) in both.fences() {
        println!("{key}: fence {fence}");
    }
    both.release().await
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("MOLTLOCK_URL").ok())
        .unwrap_or_else(|| "sqlite://moltlock-example.db".to_owned());
    let manager = moltlock::manager(&url).await?;
    encode(&manager).await?;
    config(&manager).await?;
    transfer(&manager).await
}
