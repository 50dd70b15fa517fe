//! The SQL floors' lent connections against a real Postgres: each is lent
//! to one cycle at a time, more cycles than connections wait their turn,
//! and no connection besides the lent ones is used.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_bench::floor::Lent;
use sqlx::postgres::PgPoolOptions;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_connection_serves_one_cycle_at_a_time() -> TestResult {
    let url = moltlock_fixtures::postgres::shared_url()?;
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect(&url)
        .await?;
    let lent = Arc::new(Lent::new(&pool, 2).await?);
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (lent, in_use, seen) = (lent.clone(), in_use.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let mut c = lent.take().await?;
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut *c)
                    .await
                    .map_err(|e| e.to_string())?;
                let fresh = in_use.lock().map_err(|e| e.to_string())?.insert(pid);
                seen.lock().map_err(|e| e.to_string())?.insert(pid);
                tokio::time::sleep(Duration::from_millis(1)).await;
                in_use.lock().map_err(|e| e.to_string())?.remove(&pid);
                lent.give(c);
                if !fresh {
                    return Err(format!("connection {pid} lent to two cycles at once"));
                }
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t).await???;
    }
    let seen = seen.lock().map_err(|e| e.to_string())?.len();
    assert_eq!(seen, 2, "cycles ran on {seen} connections, not the 2 lent");
    Ok(())
}
