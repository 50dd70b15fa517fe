//! The result of one scenario against one backend, and the report table.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::check::Verdict;
use crate::service::Log;
use crate::workers::Target;

/// Allowance for one hand-off on a busy two-core machine: waking a waiter,
/// its acquire round trip, process scheduling.
/// The result of one scenario against one backend.
#[derive(Debug)]
pub struct Outcome {
    /// The scenario's name.
    pub scenario: String,
    /// The backend's name.
    pub backend: String,
    /// What the checker found.
    pub verdict: Verdict,
    /// Time from the fault to the next acquisition by a healthy worker.
    pub recovery: Option<Duration>,
    /// Problems found outside the checker (a scenario's own assertions).
    pub failures: Vec<String>,
    /// Free text for the report.
    pub note: String,
    /// The whole log, for the evidence file written next to the report.
    pub log: Option<Log>,
    /// A deliberately unsafe run: the report calls it `caught` when the
    /// checker found violations (as it must), `MISSED` when not.
    pub unsafe_demo: bool,
}

impl Outcome {
    pub(crate) fn new(scenario: &str, target: &Target) -> Self {
        Self {
            scenario: scenario.to_owned(),
            backend: target.backend.to_owned(),
            verdict: Verdict::default(),
            recovery: None,
            failures: Vec::new(),
            note: String::new(),
            log: None,
            unsafe_demo: false,
        }
    }

    pub(crate) fn fail(&mut self, what: impl Into<String>) {
        self.failures.push(what.into());
    }

    /// Whether the scenario passed: no violation, no failed expectation.
    pub fn passed(&self) -> bool {
        self.verdict.clean() && self.failures.is_empty()
    }

    /// A readable account of everything that went wrong.
    pub fn explain(&self) -> String {
        let mut out = format!("{} × {}:\n", self.scenario, self.backend);
        for v in &self.verdict.violations {
            out.push_str(&format!("  violation: {v}\n"));
        }
        for f in &self.failures {
            out.push_str(&format!("  failed: {f}\n"));
        }
        out
    }

    /// Writes this outcome's row under `dir` (replacing an earlier run's row
    /// of the same scenario and backend) and renders `dir/report.md` from
    /// every row there.
    pub fn record(&self, dir: &Path) {
        let rows = dir.join("rows");
        let _ = fs::create_dir_all(&rows);
        let recovery = self
            .recovery
            .map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        let result = match (self.unsafe_demo, self.passed()) {
            (false, true) => "pass",
            (false, false) => "FAIL",
            (true, false) if !self.verdict.clean() => "caught (expected)",
            (true, _) => "MISSED",
        };
        let row = [
            self.scenario.clone(),
            self.backend.clone(),
            self.verdict.acquisitions.to_string(),
            self.verdict.violations.len().to_string(),
            recovery,
            result.to_owned(),
            self.note.replace(['\t', '\n'], " "),
        ]
        .join("\t");
        let _ = fs::write(
            rows.join(format!("{}__{}.tsv", self.scenario, self.backend)),
            row,
        );
        if let Some(log) = &self.log {
            let logs = dir.join("logs");
            let _ = fs::create_dir_all(&logs);
            let _ = fs::write(
                logs.join(format!("{}__{}.txt", self.scenario, self.backend)),
                format!("{}\n{log:#?}", self.explain()),
            );
        }
        let _ = fs::write(dir.join("report.md"), render(dir));
    }
}

/// The markdown table of every row recorded under `dir`.
pub fn render(dir: &Path) -> String {
    let mut rows: Vec<String> = fs::read_dir(dir.join("rows"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    rows.sort();
    let mut out = String::from(
        "| scenario | backend | acquisitions | violations | time to recover | result | notes |\n\
         |---|---|---:|---:|---:|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} |\n",
            r.trim().split('\t').collect::<Vec<_>>().join(" | ")
        ));
    }
    out
}
