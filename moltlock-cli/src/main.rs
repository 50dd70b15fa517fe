//! `moltlock`: run a command under a distributed lock, inspect holders, and
//! check a store against the lock contract.

mod check;
mod duration;
mod run;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// The command ran and exited with this status.
const EXIT_OK: u8 = 0;
/// A store or usage error (connection refused, bad URL, bad key).
const EXIT_ERROR: u8 = 70;
/// `--no-wait` and the lock was held elsewhere.
const EXIT_BUSY: u8 = 75;
/// Waiting for the lock took longer than `--timeout`.
const EXIT_TIMEOUT: u8 = 124;
/// The lock was lost while the command ran; the command was stopped.
const EXIT_LOST: u8 = 125;

const AFTER_HELP: &str = "\
Exit status of `run`: the command's own status (128+N when killed by signal N);
  75 the lock is held elsewhere (--no-wait); 124 the wait timed out (--timeout);
  125 the lock was lost while the command ran (it got SIGTERM, then SIGKILL);
  126 the command could not be executed; 127 the command was not found;
  70 a store or usage error.

Examples:
  moltlock run --key nightly-report -- ./report.sh
  moltlock --url redis://127.0.0.1:6379/ run --key deploy --no-wait -- make deploy
  moltlock --url postgres://app@db/locks run --key backup --timeout 5m -- pg_dump app
  moltlock status --prefix jobs/ --json
  moltlock conformance --url etcd://127.0.0.1:2379";

/// Distributed locks over etcd, Redis, Postgres, SQLite and MySQL.
#[derive(Parser, Debug)]
#[command(name = "moltlock", version, after_help = AFTER_HELP)]
struct Cli {
    /// The lock store: sqlite://FILE, postgres://…, mysql://…, redis://…,
    /// rediss://…, redis+cluster://…, etcd://…, etcds://…
    #[arg(
        long,
        env = "MOLTLOCK_URL",
        default_value = "sqlite://moltlock.db",
        global = true
    )]
    url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock (renewed automatically).
    ///
    /// The command sees MOLTLOCK_KEY and MOLTLOCK_FENCE (the fencing token:
    /// pass it with its writes so a resource can refuse a stale holder).
    Run(run::RunArgs),
    /// Show current holders, their fences and time left.
    Status(status::StatusArgs),
    /// Run the conformance suite against the store at --url.
    Conformance(check::CheckArgs),
}

/// Parses a duration such as `30s`, `500ms`, `2m`, `1h` or `1.5s`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    duration::parse(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("moltlock: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let code = runtime.block_on(dispatch(cli));
    // Give best-effort releases a moment, but never hang on exit.
    runtime.shutdown_timeout(Duration::from_secs(2));
    ExitCode::from(code)
}

async fn dispatch(cli: Cli) -> u8 {
    let result = match cli.command {
        Command::Run(args) => run::run(&cli.url, args).await,
        Command::Status(args) => status::status(&cli.url, args).await,
        Command::Conformance(args) => check::check(&cli.url, args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moltlock: {e}");
            EXIT_ERROR
        }
    }
}

/// Whether to colour output: only on a terminal, and never with NO_COLOR.
fn colour(stream_is_terminal: bool) -> bool {
    stream_is_terminal && std::env::var_os("NO_COLOR").is_none()
}

/// Paints `text` with an ANSI colour code when `on`.
fn paint(text: &str, code: &str, on: bool) -> String {
    if on {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_parses_and_lists_examples() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("moltlock run --key nightly-report"), "{help}");
    }

    #[test]
    fn paint_only_when_asked() {
        assert_eq!(paint("x", "32", false), "x");
        assert_eq!(paint("x", "32", true), "\x1b[32mx\x1b[0m");
        assert!(!colour(false));
    }

    #[test]
    fn exit_codes_are_distinct() {
        let codes = [EXIT_OK, EXIT_ERROR, EXIT_BUSY, EXIT_TIMEOUT, EXIT_LOST];
        let set: std::collections::HashSet<u8> = codes.into_iter().collect();
        assert_eq!(set.len(), codes.len());
    }
}
