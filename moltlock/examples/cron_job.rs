//! A cron job meant to run under `moltlock run` (docs/CRON.md): it reads
//! its lock's key and fence from MOLTLOCK_KEY and MOLTLOCK_FENCE, sends the
//! fence with its write (a fenced `UPDATE` on an SQLite file), and stops
//! cleanly on SIGTERM, which `moltlock run` sends when the lock is lost or
//! cannot be renewed in time (SIGKILL follows after `--grace`).
//!
//! ```sh
//! cargo build -p moltlock --example cron_job
//! cargo run -p moltlock-cli -- run --key jobs/cron-demo --no-wait -- \
//!     target/debug/examples/cron_job
//! ```
//!
//! JOB_DB names the job's own database (default `cron-job.db`), JOB_STEPS
//! how many one-second steps the work takes (default 3).

use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use tokio::signal::unix::{signal, SignalKind};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// 128 + SIGTERM, as a shell reports a job stopped by SIGTERM.
const STOPPED: u8 = 143;

#[tokio::main]
async fn main() -> Result<std::process::ExitCode, BoxError> {
    let (Ok(key), Ok(fence)) = (
        std::env::var("MOLTLOCK_KEY"),
        std::env::var("MOLTLOCK_FENCE"),
    ) else {
        return Err("run me under `moltlock run --key … -- cron_job`".into());
    };
    let fence: i64 = fence
        .parse()
        .map_err(|e| format!("MOLTLOCK_FENCE {fence:?}: {e}"))?;
    let steps: u32 = match std::env::var("JOB_STEPS") {
        Ok(s) => s.parse().map_err(|e| format!("JOB_STEPS {s:?}: {e}"))?,
        Err(_) => 3,
    };
    let path = std::env::var("JOB_DB").unwrap_or_else(|_| "cron-job.db".to_owned());
    let opts = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let db = SqlitePool::connect_with(opts).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS job_runs (
             job TEXT PRIMARY KEY, runs INTEGER NOT NULL, last_fence INTEGER NOT NULL)",
    )
    .execute(&db)
    .await?;
    sqlx::query("INSERT OR IGNORE INTO job_runs (job, runs, last_fence) VALUES (?1, 0, 0)")
        .bind(&key)
        .execute(&db)
        .await?;

    // The work, in steps; a SIGTERM between steps stops it before its write.
    let mut term = signal(SignalKind::terminate())?;
    for step in 1..=steps {
        tokio::select! {
            _ = term.recv() => {
                eprintln!("cron_job: SIGTERM at step {step}; stopping without writing");
                return Ok(STOPPED.into());
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }

    // One fenced write: refused if a run with a later fence wrote already.
    let done = sqlx::query(
        "UPDATE job_runs SET runs = runs + 1, last_fence = ?2 WHERE job = ?1 AND last_fence < ?2",
    )
    .bind(&key)
    .bind(fence)
    .execute(&db)
    .await?;
    if done.rows_affected() == 0 {
        eprintln!("cron_job: a later run of {key} wrote first; fence {fence} refused");
        return Ok(1.into());
    }
    println!("cron_job: {key} done with fence {fence}");
    Ok(std::process::ExitCode::SUCCESS)
}
