//! `moltlock conformance`: the lock contract, checked against a live store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use moltlock::Error;
use moltlock_conformance::{cases, factory_dyn, run_case, CaseResult, Outcome};
use tokio::sync::Semaphore;

use crate::paint::{colour, paint};

/// Options of `moltlock conformance`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// How many cases run at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Only cases whose name contains this.
    #[arg(long)]
    only: Option<String>,
}

/// Runs the suite, printing each case as it finishes (name, ok / FAILED /
/// skipped, time) and then `N passed, N failed, N skipped`; status 1 if any
/// case failed.
pub async fn check(url: &str, args: CheckArgs) -> Result<u8, Error> {
    let probe = moltlock::connect(url).await?;
    println!("checking {} against the lock contract", probe.name());
    drop(probe);
    let url = url.to_owned();
    let factory = factory_dyn(move || {
        let url = url.clone();
        async move { moltlock::connect(&url).await }
    });
    let gate = Arc::new(Semaphore::new(args.parallel.max(1)));
    let selected: Vec<_> = cases::ALL
        .iter()
        .filter(|case| args.only.as_deref().is_none_or(|o| case.name.contains(o)))
        .collect();
    let width = selected.iter().map(|c| c.name.len()).max().unwrap_or(4);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for case in selected {
        let (gate, factory, tx) = (gate.clone(), factory.clone(), tx.clone());
        let handle = tokio::spawn(async move {
            let _permit = gate.acquire_owned().await;
            let started = Instant::now();
            let result = run_case(case, factory).await;
            (result, started.elapsed())
        });
        tokio::spawn(async move {
            let done = match handle.await {
                Ok(r) => r,
                Err(e) => (Err(format!("the case panicked: {e}")), Duration::ZERO),
            };
            let _ = tx.send((case.name, done.0, done.1));
        });
    }
    drop(tx);
    let on = colour(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let mut tally = Tally::default();
    while let Some((name, result, took)) = rx.recv().await {
        print!("{}", tally.line(name, &result, took, width, on));
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    println!("{}", tally.summary());
    Ok(u8::from(tally.failed > 0))
}

/// Counts of finished cases.
#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Tally {
    /// One finished case's line, counted.
    fn line(
        &mut self,
        name: &str,
        result: &CaseResult,
        took: Duration,
        width: usize,
        on: bool,
    ) -> String {
        let took = crate::duration::format(took);
        let (word, detail) = match result {
            Ok(Outcome::Passed) => {
                self.passed += 1;
                (paint("ok", "32", on), String::new())
            }
            Ok(Outcome::Skipped(why)) => {
                self.skipped += 1;
                (paint("skipped", "33", on), format!("  {why}"))
            }
            Err(msg) => {
                self.failed += 1;
                (paint("FAILED", "31", on), format!("  {msg}"))
            }
        };
        format!("{name:width$}  {word}  {took}{detail}\n")
    }

    fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_counts() {
        let mut t = Tally::default();
        let ms = Duration::from_millis(5);
        let a = t.line("a", &Ok(Outcome::Passed), ms, 2, false);
        let b = t.line(
            "bb",
            &Ok(Outcome::Skipped("no fair queue".into())),
            ms,
            2,
            false,
        );
        let c = t.line(
            "c",
            &Err("boom".into()),
            Duration::from_millis(1500),
            2,
            false,
        );
        assert_eq!(a, "a   ok  5ms\n");
        assert_eq!(b, "bb  skipped  5ms  no fair queue\n");
        assert_eq!(c, "c   FAILED  1.5s  boom\n");
        assert_eq!(t.summary(), "1 passed, 1 failed, 1 skipped");
    }
}
