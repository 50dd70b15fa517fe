//! Renewal cost at scale: many locks held by one manager for three renewal
//! intervals. Counts the renewal requests the manager issues (through a
//! counting wrapper), the store's own request counters where it has them,
//! client CPU time and resident memory per held lock.

use std::time::Duration;

use moltlock::{LockManager, Store};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::counting::Counting;
use crate::floor::Floor;
use crate::holds::{acquire_all, release_all};
use crate::sysinfo::cpu_time;
use crate::target::Target;

/// Renewal intervals observed.
pub const INTERVALS: u32 = 3;

/// What holding many locks cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RenewalResult {
    /// Locks held.
    pub locks: usize,
    /// Their TTL, in milliseconds.
    pub ttl_ms: u64,
    /// The renewal interval (TTL/3), in milliseconds.
    pub interval_ms: u64,
    /// Seconds it took to acquire them all (32 tasks).
    pub acquire_secs: f64,
    /// Client CPU time spent acquiring them, in milliseconds.
    pub acquire_cpu_ms: f64,
    /// `renew_many` calls (renewal round trips issued) per interval.
    pub rounds_per_interval: f64,
    /// Holds renewed per interval (should equal `locks`).
    pub renewed_per_interval: f64,
    /// Other requests (`cas`) during the window, per interval.
    pub other_requests_per_interval: f64,
    /// The store's own request counter per interval, where read: etcd gRPC
    /// Txn + Range + LeaseTimeToLive + keep-alive messages; Redis commands (shared server);
    /// Postgres statements the manager sent (each of its requests is one).
    pub store_ops_per_interval: Option<f64>,
    /// Client CPU time per interval, in milliseconds.
    pub cpu_ms_per_interval: f64,
    /// Resident memory added per held lock, in bytes, measured in a fresh
    /// child process (see [`crate::memory`]).
    pub bytes_per_lock: f64,
    /// Holds not held at the end (lost during the window).
    pub lost: usize,
}

/// Holds `locks` locks for [`INTERVALS`] renewal intervals of `ttl / 3`
/// (raised to the backend's shortest TTL).
///
/// # Errors
/// Connection, acquisition or release errors, as text.
pub async fn renewal(
    t: &Target,
    floor: &Floor,
    locks: usize,
    ttl: Duration,
    tasks: usize,
) -> Result<RenewalResult, String> {
    let backend = t.backend().await?;
    let ttl = ttl.max(backend.limits().min_ttl);
    let (counting, counts) = Counting::new(backend);
    let manager = LockManager::builder(counting)
        .ttl(ttl)
        .build()
        .map_err(|e| e.to_string())?;
    let cpu0 = cpu_time().unwrap_or_default();
    let started = Instant::now();
    let guards = acquire_all(t, &manager, "renew", locks, tasks).await?;
    let acquire_secs = started.elapsed().as_secs_f64();
    let cpu1 = cpu_time().unwrap_or_default();
    let c0 = counts.get();
    let s0 = store_ops(t, floor).await;
    let interval = ttl / 3;
    tokio::time::sleep(interval * INTERVALS).await;
    let c1 = counts.get();
    let s1 = store_ops(t, floor).await;
    let cpu2 = cpu_time().unwrap_or_default();
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    release_all(guards, tasks).await?;
    drop(manager);
    let bytes_per_lock = crate::memory::bytes_per_lock(t, locks, ttl, tasks).await?;
    let n = f64::from(INTERVALS);
    Ok(RenewalResult {
        locks,
        ttl_ms: ttl.as_millis() as u64,
        interval_ms: interval.as_millis() as u64,
        acquire_secs,
        acquire_cpu_ms: (cpu1.saturating_sub(cpu0)).as_secs_f64() * 1e3,
        rounds_per_interval: (c1.renew_many - c0.renew_many) as f64 / n,
        renewed_per_interval: (c1.renew_items - c0.renew_items) as f64 / n,
        other_requests_per_interval: (c1.cas - c0.cas) as f64 / n,
        store_ops_per_interval: match t.store {
            // Every request of the Postgres backend is one statement.
            Store::Postgres => Some(c1.requests().saturating_sub(c0.requests()) as f64 / n),
            _ => s0.zip(s1).map(|(a, b)| b.saturating_sub(a) as f64 / n),
        },
        cpu_ms_per_interval: cpu2.saturating_sub(cpu1).as_secs_f64() * 1e3 / n,
        bytes_per_lock,
        lost,
    })
}

/// The store's own request counter, where it has one we can read (etcd,
/// Redis; Postgres statements are counted by the wrapper instead).
async fn store_ops(t: &Target, floor: &Floor) -> Option<u64> {
    match (t.store, floor) {
        (Store::Etcd, _) => {
            let endpoint = t.etcd_endpoints().into_iter().next()?;
            etcd_ops(&endpoint).await
        }
        (Store::Redis, Floor::Redis { conn, .. }) => {
            let mut c = conn.clone();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut c)
                .await
                .ok()?;
            Some(redis_calls(&info))
        }
        _ => None,
    }
}

/// The sum of `calls=` over `INFO commandstats`.
fn redis_calls(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// etcd's handled Txn, Range and LeaseTimeToLive calls plus received
/// keep-alive messages, from `/metrics` on the client port.
async fn etcd_ops(endpoint: &str) -> Option<u64> {
    let text = http_get(endpoint, "/metrics").await?;
    let mut total = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let counted = (line.starts_with("grpc_server_handled_total{")
            && ["Txn", "Range", "LeaseTimeToLive"]
                .iter()
                .any(|m| line.contains(&format!("grpc_method=\"{m}\""))))
            || (line.starts_with("grpc_server_msg_received_total{")
                && line.contains("grpc_method=\"LeaseKeepAlive\""));
        if counted {
            total += line.rsplit(' ').next()?.parse::<f64>().ok()?;
        }
    }
    Some(total as u64)
}

async fn http_get(endpoint: &str, path: &str) -> Option<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(endpoint).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .ok()?
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_redis_calls() {
        let info =
            "# Commandstats\r\ncmdstat_get:calls=3,usec=1\r\ncmdstat_evalsha:calls=10,usec=5\r\n";
        assert_eq!(super::redis_calls(info), 13);
    }
}
