//! Enforcing a fence at an SQL row (docs/FENCING.md, section 1): a holder
//! whose lock ended while its write was on the way must not overwrite the
//! work of the holder after it. The row keeps the fence of its last write,
//! and the write is `UPDATE … WHERE last_fence < $fence`: one statement, so
//! the database checks and writes under the row's lock.
//!
//! The services that check fences over HTTP (a service keeping the highest
//! fence, an object store's conditional writes) are in `fencing_http.rs`.
//!
//! ```sh
//! cargo run -p moltlock --example fencing          # locks and the row in SQLite files
//! REPORTS_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p moltlock --example fencing
//! MOLTLOCK_URL=redis://127.0.0.1:6379/ cargo run -p moltlock --features redis --example fencing
//! ```

use moltlock::Fence;
use sqlx::AnyPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock every writer of the `nightly` report takes.
const KEY: &str = "reports/nightly";

/// The resource: a table whose rows remember the fence of their last write
/// (named for this run, so runs on a shared database never meet).
struct Reports {
    pool: AnyPool,
    table: String,
}

impl Reports {
    async fn open(url: &str) -> Result<Self, BoxError> {
        sqlx::any::install_default_drivers();
        let pool = AnyPool::connect(url).await?;
        let table = format!("reports_{}", std::process::id());
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                 id TEXT PRIMARY KEY, body TEXT NOT NULL, last_fence BIGINT NOT NULL)"
        ))
        .execute(&pool)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO {table} (id, body, last_fence) VALUES ('nightly', '', 0)
             ON CONFLICT (id) DO NOTHING"
        ))
        .execute(&pool)
        .await?;
        Ok(Self { pool, table })
    }

    /// Writes the report only if no holder with a later fence wrote it
    /// first. Returns whether the row was written.
    async fn write(&self, body: &str, fence: Fence) -> Result<bool, BoxError> {
        // Every store's fences fit a signed 64-bit column.
        let fence = i64::try_from(fence.get())?;
        let done = sqlx::query(&format!(
            "UPDATE {} SET body = $1, last_fence = $2 WHERE id = 'nightly' AND last_fence < $2",
            self.table
        ))
        .bind(body)
        .bind(fence)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn body(&self) -> Result<String, BoxError> {
        let sql = format!("SELECT body FROM {} WHERE id = 'nightly'", self.table);
        let (body,): (String,) = sqlx::query_as(&sql).fetch_one(&self.pool).await?;
        Ok(body)
    }

    async fn drop_table(self) -> Result<(), BoxError> {
        sqlx::query(&format!("DROP TABLE {}", self.table))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("MOLTLOCK_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("locks.db").display()));
    let reports_url = std::env::var("REPORTS_URL").unwrap_or_else(|_| {
        format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("reports.db").display()
        )
    });
    let manager = moltlock::manager(&url).await?;
    let reports = Reports::open(&reports_url).await?;

    // Worker A holds the lock and sends its write, which is delayed (a GC
    // pause, a slow network). Its lock ends meanwhile: here it is released,
    // in life it expires while A is paused.
    let a = manager.lock(KEY).await?;
    let fence_a = a.fence();
    a.release().await?;

    // Worker B takes the lock: a later fence. Its write goes through.
    let b = manager.lock(KEY).await?;
    let fence_b = b.fence();
    let b_wrote = reports.write("B's report", fence_b).await?;
    b.release().await?;

    // A's delayed write arrives last, and the row refuses it.
    let a_wrote = reports.write("A's stale report", fence_a).await?;
    let body = reports.body().await?;
    reports.drop_table().await?;
    println!("A had fence {fence_a}, B has fence {fence_b}");
    println!("row: B written {b_wrote}, A written {a_wrote}; the report reads {body:?}");
    if !(b_wrote && !a_wrote && body == "B's report") {
        return Err("a stale write was not refused".into());
    }
    Ok(())
}
