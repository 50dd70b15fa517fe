//! Enforcing a fence at the resource (docs/FENCING.md): a holder whose lock
//! ended while its write was on the way must not overwrite the work of the
//! holder after it. Two resources check the fence themselves: an SQL row
//! (`UPDATE … WHERE last_fence < $fence`) and an in-process service that
//! keeps the highest fence it has seen.
//!
//! ```sh
//! cargo run -p moltlock --example fencing          # locks and resource in SQLite files
//! MOLTLOCK_URL=redis://127.0.0.1:6379/ cargo run -p moltlock --features redis --example fencing
//! ```

use std::collections::HashMap;
use std::sync::Mutex;

use moltlock::Fence;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock every writer of the `nightly` report takes.
const KEY: &str = "reports/nightly";

/// The resource: a table whose rows remember the fence of their last write.
async fn open_reports(path: &std::path::Path) -> Result<SqlitePool, sqlx::Error> {
    let opts = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(opts).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS reports (
             id TEXT PRIMARY KEY, body TEXT NOT NULL, last_fence INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("INSERT OR IGNORE INTO reports (id, body, last_fence) VALUES ('nightly', '', 0)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// Writes the report only if no holder with a later fence wrote it first.
/// The check and the write are one statement, so no other write can come
/// between them. Returns whether the row was written.
async fn write_report(pool: &SqlitePool, body: &str, fence: Fence) -> Result<bool, BoxError> {
    // SQLite integers are signed 64-bit; every store's fences fit.
    let fence = i64::try_from(fence.get())?;
    let done = sqlx::query(
        "UPDATE reports SET body = ?1, last_fence = ?2 WHERE id = 'nightly' AND last_fence < ?2",
    )
    .bind(body)
    .bind(fence)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A service (an HTTP API, a queue consumer, …) that refuses writes from
/// older holders: it keeps, per lock key, the highest fence it has seen.
/// The same holder may write several times with its fence.
#[derive(Default)]
struct FencedService {
    highest: Mutex<HashMap<String, u64>>,
    stored: Mutex<Vec<String>>,
}

/// Why the service refused a write (HTTP would answer 409 Conflict).
#[derive(Debug)]
struct Stale {
    fence: u64,
    highest: u64,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "409 Conflict: fence {} is older than {}, the highest seen",
            self.fence, self.highest
        )
    }
}

impl FencedService {
    /// Stores `body` if `fence` is not older than the key's highest fence.
    fn put(&self, key: &str, fence: Fence, body: &str) -> Result<(), Stale> {
        // A poisoned lock only means another request panicked; the map is
        // still consistent (it is updated in one assignment).
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        let seen = highest.entry(key.to_owned()).or_insert(0);
        if fence.get() < *seen {
            return Err(Stale {
                fence: fence.get(),
                highest: *seen,
            });
        }
        *seen = fence.get();
        // Still under the fence check's lock: no older holder can slip in.
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        stored.push(body.to_owned());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("MOLTLOCK_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("locks.db").display()));
    let manager = moltlock::manager(&url).await?;
    let reports = open_reports(&dir.path().join("reports.db")).await?;
    let service = FencedService::default();

    // Worker A holds the lock and sends its write, which is delayed (a GC
    // pause, a slow network). Its lock ends meanwhile: here it is released,
    // in life it expires while A is paused.
    let a = manager.lock(KEY).await?;
    let fence_a = a.fence();
    a.release().await?;

    // Worker B takes the lock: a later fence. Its writes go through.
    let b = manager.lock(KEY).await?;
    let fence_b = b.fence();
    println!("A had fence {fence_a}, B has fence {fence_b}");
    let b_wrote = write_report(&reports, "B's report", fence_b).await?;
    let b_put = service.put(KEY, fence_b, "B's report");
    b.release().await?;

    // A's delayed writes arrive last, and both resources refuse them.
    let a_wrote = write_report(&reports, "A's stale report", fence_a).await?;
    let a_put = service.put(KEY, fence_a, "A's stale report");
    println!("SQL row: B written {b_wrote}, A written {a_wrote}");
    let said = |r: &Result<(), Stale>| match r {
        Ok(()) => "stored".to_owned(),
        Err(stale) => stale.to_string(),
    };
    println!("service: B {}, A {}", said(&b_put), said(&a_put));

    let (body,): (String,) = sqlx::query_as("SELECT body FROM reports WHERE id = 'nightly'")
        .fetch_one(&reports)
        .await?;
    println!("the report now reads {body:?}");
    if !(b_wrote && !a_wrote && b_put.is_ok() && a_put.is_err() && body == "B's report") {
        return Err("a stale write was not refused".into());
    }
    Ok(())
}
