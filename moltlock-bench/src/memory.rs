//! Client memory per held lock, measured in a child process of its own.
//!
//! A process that has already run other sections keeps the memory they
//! freed, and its allocator hands that out again: the parent's resident
//! set can stay flat while it takes thousands of locks (it read 0 bytes
//! per lock on three stores). A fresh process grows by what the holds
//! take: the child connects and takes half the locks with one manager
//! (which also opens the pool's connections, fills the store client's
//! caches and grows the tasks' stacks: costs of a process, not of a lock),
//! reads its resident set, takes the other half, reads it again, prints
//! the bytes added per lock of the second half and releases them all. It
//! writes in the parent's key space (its run id), so the parent's cleanup
//! covers it; run on its own (no run id given), it cleans up after itself.

use std::time::Duration;

use moltlock::LockManager;

use crate::floor::Floor;
use crate::holds::{acquire_all, release_all};
use crate::sysinfo::rss_bytes;
use crate::target::Target;

/// The flag the child runs under.
pub const PROBE_FLAG: &str = "--memory-probe";

/// Runs the probe for `t` in a child process (this program again): the
/// resident bytes added per lock while `locks` locks of TTL `ttl` are held,
/// taken by `tasks` tasks.
///
/// # Errors
/// The child could not run, failed, or printed no number.
pub async fn bytes_per_lock(
    t: &Target,
    locks: usize,
    ttl: Duration,
    tasks: usize,
) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("memory probe: {e}"))?;
    let args = [
        "--url".to_owned(),
        t.url.clone(),
        PROBE_FLAG.to_owned(),
        "--run-id".to_owned(),
        t.run.clone(),
        "--locks".to_owned(),
        locks.to_string(),
        "--tasks".to_owned(),
        tasks.to_string(),
        "--renew-ttl".to_owned(),
        format!("{}ms", ttl.as_millis()),
    ];
    let run = move || std::process::Command::new(exe).args(args).output();
    let out = tokio::task::spawn_blocking(run)
        .await
        .map_err(|e| format!("memory probe: {e}"))?
        .map_err(|e| format!("memory probe: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "memory probe failed ({}): {}",
            out.status,
            err.trim()
        ));
    }
    parse(&text)
}

/// The child's side: what [`bytes_per_lock`] reports, measured in this
/// process, for `locks` locks on `url` of TTL `ttl` (raised to the
/// backend's shortest) taken by `tasks` tasks, under the run id `run` (a
/// fresh one when `None`).
///
/// # Errors
/// A bad URL, or connection, acquisition or release errors, as text.
pub async fn probe(
    url: &str,
    run: Option<&str>,
    locks: usize,
    tasks: usize,
    ttl: Duration,
) -> Result<f64, String> {
    let own = run.is_none();
    let run = run.map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned);
    let t = Target::new(url, &run)?;
    let backend = t.backend().await?;
    let ttl = ttl.max(backend.limits().min_ttl);
    let manager = LockManager::builder(backend)
        .ttl(ttl)
        .build()
        .map_err(|e| e.to_string())?;
    let first = locks / 2;
    let second = locks - first;
    let mut guards = acquire_all(&t, &manager, "memory-a", first, tasks).await?;
    let before = rss_bytes().ok_or("memory probe: no resident set size")?;
    guards.extend(acquire_all(&t, &manager, "memory-b", second, tasks).await?);
    let after = rss_bytes().ok_or("memory probe: no resident set size")?;
    release_all(guards, tasks).await?;
    if own {
        // A run of its own: nobody else removes what its keys left.
        let floor = Floor::connect(&t).await?;
        let cleaned = floor.cleanup().await;
        cleaned.and(floor.forget_run(&t).await)?;
    }
    Ok(after.saturating_sub(before) as f64 / second.max(1) as f64)
}

/// The number the child printed.
fn parse(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("memory probe printed {text:?}, not a number"))?;
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("memory probe printed {value}"))
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_the_childs_number_and_refuses_anything_else() {
        assert_eq!(parse("712.5\n"), Ok(712.5));
        assert!(parse("").is_err());
        assert!(parse("oops").is_err());
        assert!(parse("-3").is_err());
        assert!(parse("NaN").is_err());
    }
}
