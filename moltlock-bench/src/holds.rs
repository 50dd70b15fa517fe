//! Many locks held at once: taken and released by several tasks.

use std::sync::Arc;
use std::time::Duration;

use moltlock::{LockGuard, LockManager};

use crate::target::Target;

/// Takes `locks` locks of `section`'s keys with `manager`, `tasks` tasks
/// at a time.
///
/// # Errors
/// The first acquisition error, as text.
pub async fn acquire_all(
    t: &Target,
    manager: &LockManager,
    section: &'static str,
    locks: usize,
    tasks: usize,
) -> Result<Vec<LockGuard>, String> {
    let tasks = tasks.max(1);
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (manager, t) = (manager.clone(), t.clone());
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in (task..locks).step_by(tasks) {
                let key = t.key(section, i);
                let guard = manager
                    .lock_timeout(&key, Duration::from_secs(30))
                    .await
                    .map_err(|e| format!("acquiring {key}: {e}"))?;
                mine.push(guard);
            }
            Ok::<_, String>(mine)
        }));
    }
    let mut all = Vec::with_capacity(locks);
    for h in handles {
        all.extend(h.await.map_err(|e| e.to_string())??);
    }
    Ok(all)
}

/// Releases `guards`, `tasks` at a time; a hold that expired meanwhile is
/// not an error.
///
/// # Errors
/// A task that panicked, as text.
pub async fn release_all(guards: Vec<LockGuard>, tasks: usize) -> Result<(), String> {
    let guards = Arc::new(std::sync::Mutex::new(guards));
    let mut handles = Vec::new();
    for _ in 0..tasks.max(1) {
        let guards = guards.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let next = match guards.lock() {
                    Ok(mut g) => g.pop(),
                    Err(p) => p.into_inner().pop(),
                };
                let Some(g) = next else {
                    return Ok::<_, String>(());
                };
                // A hold that expired meanwhile is not an error here.
                let _ = g.release().await;
            }
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}
