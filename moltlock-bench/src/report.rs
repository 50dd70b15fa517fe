//! The results of one run, as markdown tables and JSON, and the targets
//! they are checked against.

use std::fmt::Write as _;

use serde::Serialize;

use crate::lockall::LockAllResult;
use crate::renewal::RenewalResult;
use crate::semaphore::SemaphoreResult;
use crate::stats::{ratio, Summary};
use crate::workload::{ContendedResult, LoopResult};

/// The settings a run used.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Settings {
    /// Budget per measurement, in milliseconds.
    pub duration_ms: u64,
    /// Tasks of the parallel loop.
    pub parallel_tasks: usize,
    /// Rounds in which the floor and MoltLock took turns.
    pub rounds: u32,
    /// Tasks competing for one key.
    pub contenders: usize,
    /// How long each contender holds the key, in microseconds.
    pub hold_us: u64,
    /// Locks held in the renewal section (0: skipped).
    pub renewal_locks: usize,
    /// The TTL asked for in the renewal section, in milliseconds.
    pub renewal_ttl_ms: u64,
    /// CPU cores of the machine.
    pub cores: usize,
    /// The sections measured (`--only`), in run order.
    pub sections: Vec<String>,
    /// Permits of the semaphore section's semaphore.
    pub permits: u32,
    /// Keys per `lock_all` in the multi-lock section.
    pub multi_keys: usize,
}

impl Settings {
    /// Whether the run measured `section`.
    pub fn measured(&self, section: &str) -> bool {
        self.sections.iter().any(|s| s == section)
    }
}

/// Everything measured on one backend.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BackendReport {
    /// The store (its feature name).
    pub store: String,
    /// The store's round trip that hand-offs are counted in: one command
    /// of the floor's recipe (each take and each release of one task's
    /// floor loop on free keys is a sample).
    pub rtt: Summary,
    /// One bare round trip (`PING`, `SELECT 1`, a read), for comparison.
    pub bare_rtt: Summary,
    /// The floor, one task.
    pub floor: LoopResult,
    /// MoltLock, one task.
    pub uncontended: LoopResult,
    /// MoltLock ÷ floor, one task.
    pub uncontended_ratio: f64,
    /// The floor, many tasks.
    pub floor_parallel: LoopResult,
    /// MoltLock, many tasks.
    pub parallel: LoopResult,
    /// MoltLock ÷ floor, many tasks.
    pub parallel_ratio: f64,
    /// The fair queue, one task, and the floor measured in turns with it
    /// (backends with a fair queue).
    pub fair_uncontended: Option<(LoopResult, LoopResult)>,
    /// Contention on one key, default mode.
    pub contended: Option<ContendedResult>,
    /// Contention on one key, fair mode (backends with a fair queue).
    pub contended_fair: Option<ContendedResult>,
    /// Contention on one key through one manager shared by every task.
    pub contended_shared: Option<ContendedResult>,
    /// Renewal at scale.
    pub renewal: Option<RenewalResult>,
    /// A semaphore next to a plain lock.
    pub semaphore: Option<SemaphoreResult>,
    /// `lock_all`, with and without the backend's `cas_multi`.
    pub lock_all: Option<LockAllResult>,
    /// The error that stopped this backend's run, if any.
    pub error: Option<String>,
}

impl BackendReport {
    /// The fair queue's single-task rate ÷ its floor, where measured.
    pub fn fair_ratio(&self) -> Option<f64> {
        let (floor, fair) = self.fair_uncontended.as_ref()?;
        Some(ratio(fair.per_sec, floor.per_sec))
    }
}

/// A lock other than MoltLock run with the same workloads.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PeerReport {
    /// Its name.
    pub name: String,
    /// The store it runs on.
    pub store: String,
    /// The store's floor, one task, measured in turns with `uncontended`.
    pub floor: LoopResult,
    /// One task on distinct keys.
    pub uncontended: LoopResult,
    /// Its ratio to `floor`.
    pub uncontended_ratio: f64,
    /// Contention on one key.
    pub contended: Option<ContendedResult>,
    /// The error that stopped this peer's run, if any.
    pub error: Option<String>,
}

/// One checked target.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What is checked, on which backend.
    pub what: String,
    /// The measured value against the goal, in words.
    pub value: String,
    /// Whether the target is met.
    pub met: bool,
}

/// A whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Settings.
    pub settings: Settings,
    /// Per backend.
    pub backends: Vec<BackendReport>,
    /// Peers.
    pub peers: Vec<PeerReport>,
    /// Targets and whether each was met.
    pub checks: Vec<Check>,
}

/// Microseconds in milliseconds.
pub(crate) fn ms(us: f64) -> f64 {
    us / 1e3
}

impl Report {
    /// The markdown tables.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let st = &self.settings;
        let _ = writeln!(
            s,
            "## MoltLock benchmark\n\n{} cores; {} ms per measurement (throughput: the floor \
             and MoltLock cycle by cycle with one task, in {} alternating rounds with more); \
             {} parallel tasks; \
             {} contenders holding {} µs; renewal: {} locks, TTL {} ms; sections: {}.\n",
            st.cores,
            st.duration_ms,
            st.rounds,
            st.parallel_tasks,
            st.contenders,
            st.hold_us,
            st.renewal_locks,
            st.renewal_ttl_ms,
            st.sections.join(", ")
        );
        self.summary_table(&mut s);
        self.per_store_tables(&mut s);
        if st.measured("throughput") {
            self.throughput_table(&mut s);
        } else {
            self.errors_table(&mut s);
        }
        let contended = self.backends.iter().any(|b| b.contended.is_some());
        if contended || self.peers.iter().any(|p| p.contended.is_some()) {
            self.contended_table(&mut s);
        }
        if self.backends.iter().any(|b| b.renewal.is_some()) {
            self.renewal_table(&mut s);
        }
        self.primitive_tables(&mut s);
        self.checks_table(&mut s);
        s
    }

    fn throughput_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Floor, uncontended and parallel (cycles/s; ratio = lock ÷ floor)\n\n\
             | lock | RTT p50 µs | floor 1 task | lock 1 task | p50 µs | p99 µs | ratio | floor {n} tasks | lock {n} tasks | ratio |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            n = self.settings.parallel_tasks
        );
        for b in &self.backends {
            if let Some(e) = &b.error {
                let _ = writeln!(
                    s,
                    "| moltlock {} | error: {} |",
                    b.store,
                    e.replace('|', "/")
                );
                continue;
            }
            let _ = writeln!(
                s,
                "| moltlock {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} |",
                b.store,
                b.rtt.p50_us,
                b.floor.per_sec,
                b.uncontended.per_sec,
                b.uncontended.latency.p50_us,
                b.uncontended.latency.p99_us,
                b.uncontended_ratio,
                b.floor_parallel.per_sec,
                b.parallel.per_sec,
                b.parallel_ratio
            );
            if let (Some((floor, fair)), Some(x)) = (&b.fair_uncontended, b.fair_ratio()) {
                let _ = writeln!(
                    s,
                    "| moltlock {} fair | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {x:.2} | | | |",
                    b.store,
                    b.rtt.p50_us,
                    floor.per_sec,
                    fair.per_sec,
                    fair.latency.p50_us,
                    fair.latency.p99_us,
                );
            }
        }
        for p in &self.peers {
            let floor = p.floor.per_sec;
            let _ = writeln!(
                s,
                "| {} | | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | | | |",
                p.name,
                floor,
                p.uncontended.per_sec,
                p.uncontended.latency.p50_us,
                p.uncontended.latency.p99_us,
                p.uncontended_ratio
            );
        }
        s.push('\n');
    }

    fn contended_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Contended: {} tasks on one key\n\n\
             Mode *default*: a manager per task, as separate processes; *shared*: one \
             manager for every task, as one service. Requests: the store requests the \
             managers sent per acquisition (acquire, release, renew; — where not counted); \
             waits: pauses on a release watch per acquisition (served by a shared \
             subscription; on Postgres each first marks the row, one request more). \
             Fences back: hand-offs whose fence did not rise (must be 0). Held: the \
             holds' p50 as kept (a thread's sleep); release: a release's p50, from its \
             start to its return.\n\n\
             | lock | mode | acq/s | releaser won | hand-off p50 µs | hand-off p99 µs | p50 ÷ RTT | longest wait ms | min task share | requests/acq | waits/acq | fences back | timeouts | overlaps | held p50 µs | release p50 µs |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            self.settings.contenders
        );
        for b in &self.backends {
            let rows = [
                ("default", &b.contended),
                ("shared", &b.contended_shared),
                ("fair", &b.contended_fair),
            ];
            for (mode, c) in rows {
                if let Some(c) = c {
                    let name = format!("moltlock {}", b.store);
                    contended_row(s, &name, mode, c, b.rtt.p50_us);
                }
            }
        }
        for p in &self.peers {
            if let Some(c) = &p.contended {
                let rtt = self.backend(&p.store).map_or(0.0, |b| b.rtt.p50_us);
                contended_row(s, &p.name, "default", c, rtt);
            }
        }
        s.push('\n');
    }

    fn renewal_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Renewal at scale (one manager, {} renewal intervals)\n\n\
             | backend | locks | TTL ms | renew round trips / interval | holds renewed / interval | store ops / interval | client CPU ms / interval | bytes / lock | acquire all s (CPU ms) | lost |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            crate::renewal::INTERVALS
        );
        for b in &self.backends {
            let Some(r) = &b.renewal else { continue };
            let ops = r
                .store_ops_per_interval
                .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.0}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {:.0} | {} | {:.1} | {:.0} | {:.2} ({:.0}) | {} |",
                b.store,
                r.locks,
                r.ttl_ms,
                r.rounds_per_interval,
                r.renewed_per_interval,
                ops,
                r.cpu_ms_per_interval,
                r.bytes_per_lock,
                r.acquire_secs,
                r.acquire_cpu_ms,
                r.lost
            );
        }
        s.push('\n');
    }

    /// The backends whose run stopped, when the throughput table (which
    /// shows them otherwise) is not printed.
    fn errors_table(&self, s: &mut String) {
        let failed: Vec<_> = self.backends.iter().filter(|b| b.error.is_some()).collect();
        if failed.is_empty() {
            return;
        }
        let _ = writeln!(s, "### Errors\n\n| backend | error |\n|---|---|");
        for b in failed {
            let e = b.error.as_deref().unwrap_or_default().replace('|', "/");
            let _ = writeln!(s, "| moltlock {} | error: {e} |", b.store);
        }
        s.push('\n');
    }

    fn primitive_tables(&self, s: &mut String) {
        let sems = self
            .backends
            .iter()
            .filter_map(|b| Some((b.store.as_str(), b.semaphore.as_ref()?)));
        crate::semaphore::table(s, sems);
        let multis = self
            .backends
            .iter()
            .filter_map(|b| Some((b.store.as_str(), b.lock_all.as_ref()?)));
        crate::lockall::table(s, multis);
    }

    fn checks_table(&self, s: &mut String) {
        if self.checks.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "### Targets\n\n| target | measured | met |\n|---|---|---|"
        );
        for c in &self.checks {
            let met = if c.met { "yes" } else { "**MISSED**" };
            let _ = writeln!(s, "| {} | {} | {} |", c.what, c.value, met);
        }
        s.push('\n');
    }

    fn backend(&self, store: &str) -> Option<&BackendReport> {
        self.backends.iter().find(|b| b.store == store)
    }
}

/// A figure, or a dash where there is none.
pub(crate) fn dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "–".to_owned())
}

fn contended_row(s: &mut String, name: &str, mode: &str, c: &ContendedResult, rtt_us: f64) {
    let _ = writeln!(
        s,
        "| {name} | {mode} | {:.0} | {:.0} % | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} % | {} | {} | {} | {} | {} | {:.0} | {:.0} |",
        c.per_sec,
        c.releaser_won * 100.0,
        c.handoff.p50_us,
        c.handoff.p99_us,
        ratio(c.handoff.p50_us, rtt_us),
        ms(c.max_wait_us),
        c.min_task_share * 100.0,
        dash(c.requests_per_acquisition.map(|v| format!("{v:.2}"))),
        dash(c.waits_per_acquisition.map(|v| format!("{v:.2}"))),
        c.fence_backwards,
        c.timeouts,
        c.overlaps,
        c.held.p50_us,
        c.release.p50_us
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Summary;

    fn contended(p50_us: f64, p99_us: f64) -> ContendedResult {
        ContendedResult {
            handoff: Summary {
                count: 100,
                p50_us,
                p99_us,
                max_us: p99_us,
            },
            tasks: 8,
            min_task_share: 0.1,
            ..ContendedResult::default()
        }
    }

    fn per_sec(per_sec: f64) -> LoopResult {
        LoopResult {
            per_sec,
            cycles: 100,
            ..LoopResult::default()
        }
    }

    /// The summary is computed from the run's own figures: ratios, the
    /// hand-off in round trips, the tail against the best peer, targets.
    #[test]
    fn summary_is_computed_from_the_figures() {
        let mut report = Report {
            settings: Settings {
                sections: vec!["throughput".into(), "contended".into()],
                parallel_tasks: 32,
                ..Settings::default()
            },
            backends: vec![BackendReport {
                store: "etcd".into(),
                rtt: Summary {
                    count: 10,
                    p50_us: 400.0,
                    p99_us: 500.0,
                    max_us: 600.0,
                },
                uncontended_ratio: 0.95,
                parallel_ratio: 0.5,
                contended: Some(contended(1200.0, 4000.0)),
                contended_fair: Some(contended(2000.0, 80_000.0)),
                fair_uncontended: Some((per_sec(1000.0), per_sec(850.0))),
                ..BackendReport::default()
            }],
            peers: vec![
                PeerReport {
                    name: "slow peer".into(),
                    contended: Some(contended(50.0, 100_000.0)),
                    ..PeerReport::default()
                },
                PeerReport {
                    name: "best peer".into(),
                    contended: Some(contended(90.0, 40_000.0)),
                    ..PeerReport::default()
                },
            ],
            checks: Vec::new(),
        };
        report.check();
        let rows = report.summary();
        assert_eq!(rows.len(), 2);
        let (d, f) = (&rows[0], &rows[1]);
        assert_eq!((d.store.as_str(), f.store.as_str()), ("etcd", "etcd fair"));
        assert_eq!(d.uncontended_ratio, Some(0.95));
        assert_eq!(d.handoff_p50_rtts, Some(3.0));
        let peer = d.peer_p99.clone().unwrap_or_default();
        assert_eq!((peer.0.as_str(), peer.1), ("best peer", 10.0));
        assert_eq!(f.peer_p99.clone().unwrap_or_default().1, 0.5);
        // The fair row's single-task ratio is its own, to its own floor.
        assert_eq!((f.uncontended_ratio, f.parallel_ratio), (Some(0.85), None));
        let fair_check = report
            .checks
            .iter()
            .find(|k| k.what.starts_with("etcd fair: uncontended"));
        assert!(fair_check.is_some_and(|k| k.met), "{:?}", report.checks);
        // default: uncontended met, parallel missed, overlap and starving
        // met, fences rise, hand-off p50 met (3.0 ×); fair adds its own.
        assert_eq!((d.targets_met, d.targets), (5, 6));
        assert!(f.targets > d.targets);
        let text = report.markdown();
        assert!(text.contains("| etcd | 0.95 × | 0.50 × | 1200 (3.0 ×) | 4000 | 10.0 × lower than best peer | 5/6 |"), "{text}");
        assert!(
            text.contains("| etcd fair |") && text.contains("2.0 × higher than best peer"),
            "{text}"
        );
    }

    /// The targets against peers: etcd's fair queue at five times the Lock
    /// RPC's contended rate with a hand-off p99 of at most 10 ms, Redis at
    /// least at rslock's single-task ratio to the floor (a peer that failed
    /// is not compared; without the throughput section, nor is rslock).
    #[test]
    fn targets_against_peers_are_checked() {
        let rate = |per_sec: f64, p99_us: f64| ContendedResult {
            per_sec,
            ..contended(500.0, p99_us)
        };
        let checks = |fair: ContendedResult, redis_ratio: f64, sections: &[&str]| {
            let mut report = Report {
                settings: Settings {
                    sections: sections.iter().map(|s| (*s).to_owned()).collect(),
                    ..Settings::default()
                },
                backends: vec![
                    BackendReport {
                        store: "etcd".into(),
                        contended_fair: Some(fair),
                        ..BackendReport::default()
                    },
                    BackendReport {
                        store: "redis".into(),
                        uncontended_ratio: redis_ratio,
                        ..BackendReport::default()
                    },
                ],
                peers: vec![
                    PeerReport {
                        name: "rslock (Redlock, 1 Redis)".into(),
                        store: "redis".into(),
                        uncontended_ratio: 0.2,
                        error: Some("it failed".into()),
                        ..PeerReport::default()
                    },
                    PeerReport {
                        name: "etcd Lock RPC".into(),
                        store: "etcd".into(),
                        contended: Some(rate(80.0, 80_000.0)),
                        ..PeerReport::default()
                    },
                    PeerReport {
                        name: "rslock (Redlock, 1 Redis)".into(),
                        store: "redis".into(),
                        uncontended_ratio: 0.95,
                        ..PeerReport::default()
                    },
                ],
                checks: Vec::new(),
            };
            report.check();
            report.checks
        };
        let met = |checks: &[Check], what: &str| {
            checks
                .iter()
                .find(|k| k.what.starts_with(what))
                .map(|k| k.met)
        };
        let both = ["throughput", "contended"];
        let (fair, rs) = ("etcd fair: ≥ 5 ×", "redis: uncontended ≥ rslock");
        let good = checks(rate(400.0, 10_000.0), 0.95, &both);
        assert_eq!(met(&good, fair), Some(true), "{good:?}");
        assert_eq!(met(&good, rs), Some(true));
        let slow = checks(rate(399.0, 9_000.0), 0.93, &both);
        assert_eq!(met(&slow, fair), Some(false));
        assert_eq!(met(&slow, rs), Some(false));
        let late = checks(rate(800.0, 10_001.0), 0.95, &both);
        assert_eq!(met(&late, fair), Some(false));
        let idle = checks(ContendedResult::default(), 0.95, &["contended"]);
        assert_eq!((met(&idle, fair), met(&idle, rs)), (None, None));
    }
}
