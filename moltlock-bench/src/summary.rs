//! The summary: one line per store and waiting mode, computed from the
//! run's own figures.

use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{dash, BackendReport, Check, Report};
use crate::stats::ratio;
use crate::workload::ContendedResult;

/// One line of the summary: a store (and waiting mode) at a glance.
#[derive(Clone, Debug, Serialize)]
pub struct SummaryRow {
    /// The store, with ` fair` for its fair queue.
    pub store: String,
    /// MoltLock ÷ floor, one task (`None`: throughput not measured).
    pub uncontended_ratio: Option<f64>,
    /// MoltLock ÷ floor, many tasks.
    pub parallel_ratio: Option<f64>,
    /// Median hand-off under contention, in microseconds.
    pub handoff_p50_us: Option<f64>,
    /// That median in round trips of the store (commands of its floor).
    pub handoff_p50_rtts: Option<f64>,
    /// 99th percentile hand-off, in microseconds.
    pub handoff_p99_us: Option<f64>,
    /// The peer with the lowest hand-off p99 of the run, and how many times
    /// its p99 is ours (above 1: ours is lower).
    pub peer_p99: Option<(String, f64)>,
    /// Targets of this store (and mode) met.
    pub targets_met: usize,
    /// Targets of this store (and mode) checked.
    pub targets: usize,
}

impl Report {
    /// One line per store and waiting mode, computed from this run's
    /// figures: MoltLock's ratio to the floor, its hand-off, its hand-off
    /// tail against the best peer's and how many targets it met.
    pub fn summary(&self) -> Vec<SummaryRow> {
        let best_peer = self
            .peers
            .iter()
            .filter(|p| p.error.is_none())
            .filter_map(|p| Some((p.name.as_str(), p.contended.as_ref()?.handoff.p99_us)))
            .filter(|(_, p99)| *p99 > 0.0)
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let throughput = self.settings.measured("throughput");
        let mut rows = Vec::new();
        for b in self.backends.iter().filter(|b| b.error.is_none()) {
            let modes = [("default", &b.contended), ("fair", &b.contended_fair)];
            let mut any = false;
            for (mode, c) in modes {
                let Some(c) = c else { continue };
                any = true;
                rows.push(self.summary_row(b, mode, Some(c), best_peer, throughput));
            }
            if !any {
                rows.push(self.summary_row(b, "default", None, best_peer, throughput));
            }
        }
        rows
    }

    pub(crate) fn summary_row(
        &self,
        b: &BackendReport,
        mode: &str,
        c: Option<&ContendedResult>,
        best_peer: Option<(&str, f64)>,
        throughput: bool,
    ) -> SummaryRow {
        let store = match mode {
            "default" => b.store.clone(),
            _ => format!("{} {mode}", b.store),
        };
        // The store's own targets, and those of this waiting mode.
        let mine = |what: &str| {
            what.starts_with(&format!("{}: ", b.store))
                || what.starts_with(&format!("{} {mode}: ", b.store))
        };
        let checks: Vec<&Check> = self.checks.iter().filter(|k| mine(&k.what)).collect();
        let peer_p99 = match (best_peer, c) {
            (Some((name, p99)), Some(c)) if c.handoff.p99_us > 0.0 => {
                Some((name.to_owned(), ratio(p99, c.handoff.p99_us)))
            }
            _ => None,
        };
        let (one, many) = match mode {
            "fair" => (b.fair_ratio(), None),
            _ => (Some(b.uncontended_ratio), Some(b.parallel_ratio)),
        };
        SummaryRow {
            store,
            uncontended_ratio: one.filter(|_| throughput),
            parallel_ratio: many.filter(|_| throughput),
            handoff_p50_us: c.map(|c| c.handoff.p50_us),
            handoff_p50_rtts: c.map(|c| ratio(c.handoff.p50_us, b.rtt.p50_us)),
            handoff_p99_us: c.map(|c| c.handoff.p99_us),
            peer_p99,
            targets_met: checks.iter().filter(|k| k.met).count(),
            targets: checks.len(),
        }
    }

    pub(crate) fn summary_table(&self, s: &mut String) {
        let rows = self.summary();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "### Summary\n\n\
             | store | 1 task ÷ floor | {n} tasks ÷ floor | hand-off p50 µs (÷ RTT) | hand-off p99 µs | p99 vs best peer | targets met |\n\
             |---|---:|---:|---:|---:|---|---:|",
            n = self.settings.parallel_tasks
        );

        for r in &rows {
            let peer = r.peer_p99.as_ref().map(|(name, x)| {
                let (x, how) = if *x >= 1.0 {
                    (*x, "lower")
                } else {
                    (1.0 / x.max(f64::MIN_POSITIVE), "higher")
                };
                format!("{x:.1} × {how} than {name}")
            });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {}/{} |",
                r.store,
                dash(r.uncontended_ratio.map(|v| format!("{v:.2} ×"))),
                dash(r.parallel_ratio.map(|v| format!("{v:.2} ×"))),
                dash(
                    r.handoff_p50_us
                        .zip(r.handoff_p50_rtts)
                        .map(|(us, x)| format!("{us:.0} ({x:.1} ×)"))
                ),
                dash(r.handoff_p99_us.map(|v| format!("{v:.0}"))),
                dash(peer),
                r.targets_met,
                r.targets
            );
        }
        s.push('\n');
    }
}
