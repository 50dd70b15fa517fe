//! `moltlock-bench`: see the library docs and `BENCHMARKS.md`.

use std::process::ExitCode;

use clap::Parser;
use moltlock_bench::{run, svg, Args};

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("moltlock-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.memory_probe {
        let url = args.urls.first().map_or("", String::as_str);
        let run = args.run_id.as_deref();
        let probe = moltlock_bench::memory::probe(url, run, args.locks, args.tasks, args.renew_ttl);
        return match rt.block_on(probe) {
            Ok(bytes) => {
                println!("{bytes}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("moltlock-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let report = rt.block_on(run(&args));
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => eprintln!("moltlock-bench: cannot write JSON: {e}"),
        }
    } else {
        print!("{}", report.markdown());
    }
    if let Some(path) = &args.json_out {
        let written = serde_json::to_string_pretty(&report)
            .map_err(|e| e.to_string())
            .and_then(|j| std::fs::write(path, j).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("moltlock-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.svg {
        if let Err(e) = std::fs::write(path, svg::handoff_chart(&report)) {
            eprintln!("moltlock-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    let failed = report.backends.iter().any(|b| b.error.is_some())
        || report.peers.iter().any(|p| p.error.is_some());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
