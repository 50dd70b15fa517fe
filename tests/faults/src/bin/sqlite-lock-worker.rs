//! A test helper: takes one key again and again and logs each critical
//! section, so tests can check that separate processes never overlap.
//!
//! `sqlite-lock-worker <sqlite-url> <key> <rounds> <log-file>` appends one
//! line per round: `<pid> <fence> <start-ns> <end-ns>` (wall clock, shared
//! by every process of the machine).

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moltlock::sqlite::SqliteBackend;
use moltlock::{LockManager, RetryPolicy};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, rounds, log] = args.as_slice() else {
        return Err("usage: sqlite-lock-worker <sqlite-url> <key> <rounds> <log-file>".into());
    };
    let rounds: u32 = rounds.parse().map_err(|e| format!("rounds: {e}"))?;
    let backend = SqliteBackend::from_url(url)
        .await
        .map_err(|e| e.to_string())?;
    let manager = LockManager::builder(backend)
        .ttl(Duration::from_secs(10))
        .retry(RetryPolicy::Fixed(Duration::from_millis(2)))
        .build()
        .map_err(|e| e.to_string())?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{log}: {e}"))?;
    for _ in 0..rounds {
        let guard = manager.lock(key).await.map_err(|e| e.to_string())?;
        let start = now_ns();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let end = now_ns();
        let line = format!("{} {} {start} {end}\n", std::process::id(), guard.fence());
        file.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
        guard.release().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}
