//! One table per store: the floor, MoltLock in each waiting mode and the
//! peers on that store, side by side.

use std::fmt::Write as _;

use crate::report::{dash, ms, BackendReport, Report};
use crate::stats::ratio;
use crate::workload::{ContendedResult, LoopResult};

impl Report {
    /// Writes a table per measured store.
    pub(crate) fn per_store_tables(&self, s: &mut String) {
        for b in self.backends.iter().filter(|b| b.error.is_none()) {
            self.store_table(b, s);
        }
    }

    fn store_table(&self, b: &BackendReport, s: &mut String) {
        let n = self.settings.parallel_tasks;
        let _ = writeln!(
            s,
            "### {} (RTT p50 {:.0} µs, a command of the floor; bare round trip {:.0} µs)\n\n\
             | lock | 1 task /s (÷ floor) | {n} tasks /s (÷ floor) | contended acq/s | requests / acq | hand-off p50 ms (÷ RTT) | hand-off p99 ms (÷ RTT) | releaser re-won | task share min / max |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|",
            b.store, b.rtt.p50_us, b.bare_rtt.p50_us
        );
        let floor = (Some(&b.floor), Some(&b.floor_parallel));
        row(s, b, "floor (the store's recipe, raw client)", floor, None);
        let mine = (Some(&b.uncontended), Some(&b.parallel));
        let contended = b.contended.as_ref();
        row(s, b, "moltlock, a manager per task", mine, contended);
        let shared = b.contended_shared.as_ref();
        row(s, b, "moltlock, one shared manager", (None, None), shared);
        if b.contended_fair.is_some() || b.fair_uncontended.is_some() {
            // Its single-task ratio is to the floor measured in turns with it.
            let fair = b.fair_uncontended.as_ref();
            let one = fair.map(|(floor, fair)| Against(fair, floor));
            write_row(
                s,
                b,
                "moltlock fair",
                (one, None),
                b.contended_fair.as_ref(),
            );
        }
        for p in self.peers.iter().filter(|p| p.store == b.store) {
            // Its single-task ratio is to the floor measured in turns with it.
            let one = Some(Against(&p.uncontended, &p.floor));
            write_row(s, b, &p.name, (one, None), p.contended.as_ref());
        }
        s.push('\n');
    }
}

/// A loop and the floor it is measured against.
struct Against<'a>(&'a LoopResult, &'a LoopResult);

/// One line: loops (1 task, many tasks) against the floor, and a
/// contended run.
fn row(
    s: &mut String,
    b: &BackendReport,
    name: &str,
    (one, many): (Option<&LoopResult>, Option<&LoopResult>),
    c: Option<&ContendedResult>,
) {
    let one = one.map(|l| Against(l, &b.floor));
    let many = many.map(|l| Against(l, &b.floor_parallel));
    write_row(s, b, name, (one, many), c);
}

fn write_row(
    s: &mut String,
    b: &BackendReport,
    name: &str,
    (one, many): (Option<Against>, Option<Against>),
    c: Option<&ContendedResult>,
) {
    let per_sec = |l: Option<Against>| {
        l.filter(|Against(l, _)| l.cycles > 0)
            .map(|Against(l, floor)| {
                format!("{:.0} ({:.2})", l.per_sec, ratio(l.per_sec, floor.per_sec))
            })
    };
    let rtts = |us: f64| format!("{:.2} ({:.1})", ms(us), ratio(us, b.rtt.p50_us));
    let _ = writeln!(
        s,
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |",
        dash(per_sec(one)),
        dash(per_sec(many)),
        dash(c.map(|c| format!("{:.0}", c.per_sec))),
        dash(c.and_then(|c| c.requests_per_acquisition.map(|v| format!("{v:.2}")))),
        dash(c.map(|c| rtts(c.handoff.p50_us))),
        dash(c.map(|c| rtts(c.handoff.p99_us))),
        dash(c.map(|c| format!("{:.0} %", c.releaser_won * 100.0))),
        dash(c.map(|c| format!(
            "{:.1} / {:.1} %",
            c.min_task_share * 100.0,
            c.max_task_share * 100.0
        ))),
    );
}
