//! `moltlock conformance`: the lock contract, checked against a live store.

use std::sync::Arc;

use clap::Args;
use moltlock::Error;
use moltlock_conformance::{cases, factory_dyn, run_case, CaseResult, Outcome};
use tokio::sync::Semaphore;

use crate::{colour, paint};

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

/// Runs the suite and prints a pass/fail table; status 1 if any case failed.
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
    let mut tasks = Vec::new();
    for case in cases::ALL {
        if args.only.as_deref().is_some_and(|o| !case.name.contains(o)) {
            continue;
        }
        let (gate, factory) = (gate.clone(), factory.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await;
            (case.name, run_case(case, factory).await)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        match t.await {
            Ok(r) => results.push(r),
            Err(e) => results.push(("(task)", Err(format!("a case panicked: {e}")))),
        }
    }
    print!(
        "{}",
        report(
            &results,
            colour(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        )
    );
    let failed = results.iter().any(|(_, r)| r.is_err());
    Ok(u8::from(failed))
}

fn report(results: &[(&str, CaseResult)], on: bool) -> String {
    let width = results.iter().map(|(n, _)| n.len()).max().unwrap_or(4);
    let mut out = String::new();
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for (name, result) in results {
        let (word, detail) = match result {
            Ok(Outcome::Passed) => {
                pass += 1;
                (paint("PASS", "32", on), String::new())
            }
            Ok(Outcome::Skipped(why)) => {
                skip += 1;
                (paint("SKIP", "33", on), why.clone())
            }
            Err(msg) => {
                fail += 1;
                (paint("FAIL", "31", on), msg.clone())
            }
        };
        out.push_str(&format!("{name:width$}  {word}  {detail}\n"));
    }
    out.push_str(&format!("{pass} passed, {fail} failed, {skip} skipped\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_counts() {
        let results = vec![
            ("a", Ok(Outcome::Passed)),
            ("bb", Ok(Outcome::Skipped("no fair queue".into()))),
            ("c", Err("boom".into())),
        ];
        let text = report(&results, false);
        assert!(text.contains("a   PASS"), "{text}");
        assert!(text.contains("c   FAIL  boom"), "{text}");
        assert!(text.ends_with("1 passed, 1 failed, 1 skipped\n"), "{text}");
    }
}
