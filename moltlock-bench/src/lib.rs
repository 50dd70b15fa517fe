//! The MoltLock benchmark harness.
//!
//! For every store URL it measures, in one run: the floor (the store's bare
//! acquire and release commands through the same client library the backend
//! uses), one task doing lock → release cycles, many tasks doing so on
//! distinct keys, tasks contending for one key (default and fair mode),
//! renewal of many held locks, a semaphore next to a plain lock, `lock_all`
//! with and without the backend's `cas_multi`, and — with `--peers` —
//! `rslock` and etcd's Lock RPC under the same workloads. It prints markdown
//! (or JSON) and can write an SVG chart of hand-off latency. Hand-offs are
//! counted in round trips of the store: one command of its floor (every
//! take and every release of a single task's floor loop timed on its own),
//! with a bare round trip (`PING`, `SELECT 1`, a read) reported beside it.
//! Every loop is bounded in time and in count. See `BENCHMARKS.md` at the
//! repository root.

mod checks;
pub mod counting;
pub mod floor;
pub mod holds;
pub mod lockall;
pub mod memory;
pub mod molt;
pub mod peers;
mod perstore;
pub mod primitives;
pub mod renewal;
pub mod report;
pub mod run;
pub mod semaphore;
pub mod stats;
pub mod summary;
pub mod svg;
pub mod sysinfo;
pub mod target;
pub mod workload;

pub use report::Report;
pub use run::{run, Args};
