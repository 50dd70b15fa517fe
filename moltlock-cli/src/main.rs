//! `moltlock`: run a command under a distributed lock, inspect holders, and
//! check a store against the lock contract.

mod conformance;
mod derived;
mod describe;
mod duration;
mod elect;
mod exit;
mod group;
mod hold;
mod mode;
mod paint;
mod revoke;
mod run;
mod status;
mod store;
mod supervise;
mod table;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use exit::{Failure, EXIT_ERROR, EXIT_OK, EXIT_USAGE};

/// How long `moltlock` waits, before exiting, for best-effort releases of
/// holds it gave up (a `--timeout` that cut an attempt short, say).
const CLEANUP_WAIT: Duration = Duration::from_secs(6);

const AFTER_HELP: &str = "\
Exit status of `run`: the command's own status (128+N when killed by signal N);
  75 the lock is held elsewhere (--no-wait); 124 the wait timed out (--timeout)
  (both replaced by --conflict-exit-code N); 125 the lock was lost, or could not
  be renewed in time, while the command ran (it got SIGTERM, then SIGKILL);
  126 the command could not be executed; 127 the command was not found;
  64 a usage error; 70 a store error.

The command runs in its own process group with a watchdog: when moltlock dies
(even by SIGKILL) or stops renewing, the whole group is killed. SIGTERM, SIGHUP
and SIGQUIT to moltlock stop the group with SIGTERM (SIGINT is passed on), then
SIGKILL after --grace. MOLTLOCK_URL is removed from the command's environment
unless --pass-url.

Examples:
  moltlock run --key nightly-report -- ./report.sh
  moltlock run --key render --permits 4 -- ./render.sh   # at most 4 at once
  moltlock run --key db --shared -- ./read.sh     # beside other --shared runs
  moltlock run --key db --exclusive -- ./migrate.sh     # alone among them
  moltlock run --key db --key cache -- ./rebuild.sh   # both keys at once
  moltlock --url redis://127.0.0.1:6379/ run --key deploy --no-wait -- make deploy
  moltlock --url postgres://app@db/locks run --key backup --timeout 5m -- pg_dump app
  moltlock status --prefix jobs/ --json
  moltlock --url etcd://127.0.0.1:2379 conformance";

/// Distributed locks over etcd, Redis, Postgres, SQLite and MySQL.
#[derive(Parser, Debug)]
#[command(name = "moltlock", version, after_help = AFTER_HELP)]
struct Cli {
    /// The lock store: sqlite://FILE, postgres://…, mysql://…, redis://…,
    /// rediss://…, redis+cluster://…, etcd://…, etcds://… [default: the
    /// per-user SQLite file $XDG_STATE_HOME/moltlock/locks.db, or
    /// ~/.local/state/moltlock/locks.db]
    #[arg(long, env = "MOLTLOCK_URL", hide_env_values = true, global = true)]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock (renewed automatically).
    ///
    /// The command sees MOLTLOCK_KEY and MOLTLOCK_FENCE (the fencing token:
    /// pass it with its writes so a resource can refuse a stale holder);
    /// with several --key, one pair per key (see --key).
    ///
    /// Besides one key (a mutex), a run can hold: one of N permits of a
    /// semaphore (--permits N: at most N such runs of the key at once), the
    /// shared or exclusive side of a read-write lock (--shared, --exclusive,
    /// as flock -s and -x), or several keys at once (--key given more than
    /// once). Each is its own kind of lock in the store: runs of one key
    /// exclude each other only when they use the same kind (and the same N).
    Run(run::RunArgs),
    /// Show current holders, their fences and time left.
    Status(status::StatusArgs),
    /// Run the conformance suite against the store at --url.
    Conformance(conformance::CheckArgs),
    /// Remove a key's current holder (read, then delete by its token, so a
    /// newer holder is never removed). The holder's renewal then fails and
    /// its `moltlock run` stops the command. With --ask, ask the holder to
    /// release instead. Status 75 when there was none.
    Revoke(revoke::RevokeArgs),
    /// Run a command only while this node leads the election of --key:
    /// campaign (in arrival order where the store has a fair queue), run
    /// the command as `run` does, stop it if leadership is lost. With
    /// --keep, campaign again whenever the command ends.
    Elect(elect::ElectArgs),
    /// Show the leader of the election of --key (its value, term and time
    /// left; status 75 when nobody leads), or with --watch every change.
    Leader(elect::LeaderArgs),
}

/// The command line, with the default store's actual path in `--help`.
fn parse_cli(default_url: Option<&str>) -> Result<Cli, u8> {
    let shown = default_url.unwrap_or("none: set HOME or XDG_STATE_HOME, or give --url");
    let cmd = Cli::command().mut_arg("url", |a| {
        a.help(format!(
            "The lock store: sqlite://FILE, postgres://…, mysql://…, redis://…, \
             rediss://…, redis+cluster://…, etcd://…, etcds://… [default: {shown}]"
        ))
    });
    let parsed = cmd
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    parsed.map_err(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                let _ = e.print();
                EXIT_OK
            }
            _ => {
                // A value on the command line may be a URL with a password.
                eprint!("{}", moltlock::redact(&e.render().to_string()));
                EXIT_USAGE
            }
        }
    })
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os().skip(1);
    if argv.next().is_some_and(|a| a == group::WATCHDOG_ARG) {
        let parent = argv.next();
        return group::watchdog_main(parent.as_deref().and_then(|p| p.to_str()));
    }
    let default_url = store::default_url();
    let cli = match parse_cli(default_url.as_deref()) {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    // `run` on one thread: the command's watchdog is forked from the main
    // thread, which lives as long as the process (Linux sends the
    // parent-death signal when the forking *thread* ends). The conformance
    // suite's cases run in parallel on several.
    let mut builder = if matches!(cli.command, Command::Run(_) | Command::Elect(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("moltlock: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let code = runtime.block_on(async {
        let code = dispatch(cli, default_url).await;
        // Releases spawned in the background (a timed-out attempt, a dropped
        // guard) must reach the store before the runtime drops them.
        moltlock::wait_for_cleanups(CLEANUP_WAIT).await;
        code
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    ExitCode::from(code)
}

async fn dispatch(cli: Cli, default_url: Option<String>) -> u8 {
    let (url, is_default) = match (cli.url, default_url) {
        (Some(u), _) => (u, false),
        (None, Some(d)) => (d, true),
        (None, None) => {
            eprintln!(
                "moltlock: no store: give --url or MOLTLOCK_URL, or set HOME (or \
                 XDG_STATE_HOME) for the per-user default"
            );
            return EXIT_USAGE;
        }
    };
    let result = match cli.command {
        Command::Run(args) => run_command(&url, is_default, args).await,
        Command::Status(args) => status::status(&url, args).await.map_err(Failure::from),
        Command::Conformance(args) => conformance::check(&url, args).await.map_err(Failure::from),
        Command::Revoke(args) => revoke::revoke(&url, args).await.map_err(Failure::from),
        Command::Elect(args) => elect_command(&url, is_default, args).await,
        Command::Leader(args) => elect::leader(&url, args).await.map_err(Failure::from),
    };
    match result {
        Ok(code) => code,
        Err(f) => {
            eprintln!("moltlock: {}", moltlock::redact(&f.message));
            f.code
        }
    }
}

async fn elect_command(url: &str, is_default: bool, args: elect::ElectArgs) -> Result<u8, Failure> {
    prepare_store(url, is_default)?;
    elect::elect(url, args).await
}

async fn run_command(url: &str, is_default: bool, args: run::RunArgs) -> Result<u8, Failure> {
    prepare_store(url, is_default)?;
    run::run(url, args).await
}

/// Checks the store is one every process of the machine shares, and
/// creates the per-user default store's folder when it is the one used.
fn prepare_store(url: &str, is_default: bool) -> Result<(), Failure> {
    let default = store::default_url();
    store::check_shared(url, default.as_deref()).map_err(Failure::usage)?;
    if is_default {
        if let Some(path) = store::default_path() {
            store::prepare_default(&path).map_err(|e| {
                Failure::error(format!(
                    "cannot create the default store {}: {e}",
                    path.display()
                ))
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_parses_and_lists_examples() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("moltlock run --key nightly-report"), "{help}");
    }
}
