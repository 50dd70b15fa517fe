//! `moltlock run`: hold a lock while a command runs, and never let the
//! command run on without it.

use std::time::Duration;

use clap::Args;
use moltlock::{Error, LockManager, LockOptions};

use crate::describe::{about, describe_self};
use crate::duration;
use crate::exit::{Failure, EXIT_BUSY, EXIT_TIMEOUT};
use crate::hold::Hold;
use crate::mode::{LockArgs, Mode};
use crate::supervise::{signal_status, Signals, Supervised};

/// The clock-drift allowance the manager is built with: a hold is trusted
/// locally for `ttl × (1 − DRIFT)` after the request that confirmed it.
const DRIFT: f64 = 0.02;
/// The grace when `--grace` is not given (shortened to fit the TTL).
const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// How long the release after the command may take.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Options of `moltlock run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// The lock's TTL; it is renewed every TTL/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    ttl: Duration,
    /// Wait for the lock (the default).
    #[arg(long, conflicts_with = "no_wait")]
    wait: bool,
    /// Fail at once (status 75) when the lock is held elsewhere.
    #[arg(long)]
    no_wait: bool,
    /// Give up waiting after this long (status 124); `0` makes one attempt.
    #[arg(long, value_parser = duration::parse, conflicts_with = "no_wait")]
    timeout: Option<Duration>,
    /// How long the command has between SIGTERM and SIGKILL when it must
    /// stop. Default 10s, or TTL × 0.48 if less; at most TTL × 0.48.
    ///
    /// The command is stopped before the store could hand the key to anyone
    /// else: it gets SIGTERM at the hold's local validity deadline minus the
    /// grace (when renewals have not extended the deadline by then), and
    /// SIGKILL at the deadline, which comes TTL × 2 % before the store's own
    /// expiry. So the grace must leave room for renewals: at most
    /// TTL × (1 − 0.02) − TTL/3 (the renewal interval) − TTL/6 (time for a
    /// failed renewal to be retried) = TTL × 0.48.
    #[arg(long, value_parser = duration::parse, verbatim_doc_comment)]
    grace: Option<Duration>,
    /// A scheduled job's lower bound: the key stays blocked until this long
    /// after the acquire request, by the store's clock, even when the
    /// command ends sooner or `moltlock` is killed (so a job started by cron
    /// on several hosts runs once per period). One plain key only.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    at_least: Option<Duration>,
    /// A scheduled job's upper bound: the lock is held at most this long
    /// after the acquire request. The command gets SIGTERM the grace before
    /// that time and SIGKILL at it, as at any validity deadline, and the key
    /// is then freed. Must be longer than the grace. One plain key only.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    at_most: Option<Duration>,
    /// Wait in a fair (arrival-order) queue; only for stores that have one
    /// (every store but a migration in its `both` phase), and only for one
    /// plain key.
    #[arg(long, conflicts_with = "no_wait")]
    fair: bool,
    /// The status to exit with when the lock was not obtained (instead of 75
    /// for --no-wait and 124 for --timeout).
    #[arg(long, value_name = "N")]
    conflict_exit_code: Option<u8>,
    /// Pass the store URL to the command as MOLTLOCK_URL. By default the
    /// command's environment has no MOLTLOCK_URL (it may hold credentials).
    #[arg(long)]
    pass_url: bool,
    /// Say who holds the key while waiting, and when the lock is acquired
    /// (also without -v when stderr is a terminal).
    #[arg(short, long)]
    verbose: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
    /// Set by `moltlock elect`: the leader's value, stored as the hold's
    /// description (instead of this process's host, pid and command).
    #[arg(skip)]
    pub(crate) value: Option<String>,
    /// Set by `moltlock elect`: wait in the store's fair queue when it has
    /// one, so candidates win in arrival order.
    #[arg(skip)]
    pub(crate) fair_if_any: bool,
}

impl RunArgs {
    /// Whether the acquisition makes one attempt only (`--no-wait`,
    /// `--timeout 0`).
    pub(crate) fn one_attempt(&self) -> bool {
        self.no_wait || self.timeout == Some(Duration::ZERO)
    }

    /// The one plain key of the run, if it is one (not a semaphore, a
    /// read-write lock or several keys).
    pub(crate) fn plain_key(&self) -> Option<&str> {
        match Mode::new(&self.lock, false) {
            Ok(Mode::One(_)) => self.lock.key.first().map(String::as_str),
            _ => None,
        }
    }
}

/// The largest `--grace` a TTL fits.
fn max_grace(ttl: Duration) -> Duration {
    ttl.mul_f64(0.5 - DRIFT)
}

/// The grace to use, or a usage error.
fn grace(args: &RunArgs) -> Result<Duration, Failure> {
    let max = max_grace(args.ttl);
    match args.grace {
        None => Ok(DEFAULT_GRACE.min(max)),
        Some(g) if g <= max => Ok(g),
        Some(g) => Err(Failure::usage(format!(
            "--grace {} does not fit --ttl {}: the command gets SIGTERM at the hold's \
             deadline minus the grace and SIGKILL at the deadline, and the grace must leave \
             room for renewals, so it can be at most TTL × 0.48 = {}; lower --grace or raise --ttl",
            duration::format(g),
            duration::format(args.ttl),
            duration::format(max),
        ))),
    }
}

/// Runs the command under the lock; returns the exit status to report.
pub async fn run(url: &str, args: RunArgs) -> Result<u8, Failure> {
    run_with(url, args, &mut Signals::new()?).await
}

/// [`run`], handling the signals of `signals`: a caller that runs several
/// times (`elect --keep`) keeps one handler, so a signal that comes between
/// two runs ends the next one at once instead of being missed by it.
pub async fn run_with(url: &str, args: RunArgs, signals: &mut Signals) -> Result<u8, Failure> {
    let grace = grace(&args)?;
    if let Some(most) = args.at_most.filter(|most| *most <= grace) {
        return Err(Failure::usage(format!(
            "--at-most {} leaves no time after the grace of {}: the command gets SIGTERM \
             at the at-most time minus the grace; raise --at-most or lower --grace",
            duration::format(most),
            duration::format(grace)
        )));
    }
    let mode = Mode::new(&args.lock, args.fair)?;
    let label = mode.label();
    // Signals are handled from here on, so every wait must also watch them.
    let backend = tokio::select! {
        b = moltlock::connect(url) => b?,
        sig = signals.recv() => return Ok(signal_status(sig)),
    };
    let manager = LockManager::builder(backend)
        .ttl(args.ttl)
        .drift(DRIFT)
        .build()?;
    if args.fair && manager.backend().fair_queue().is_none() {
        return Err(Failure::usage(format!(
            "--fair needs a store with a fair queue; {} has none (every store has one, a \
             migration in its `both` phase has not)",
            manager.backend().name()
        )));
    }
    let talk = args.verbose || std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fair = args.fair || (args.fair_if_any && manager.backend().fair_queue().is_some());
    let (opts, no_wait, one_attempt) = lock_options(&args, fair);
    let conflict = |default: u8| args.conflict_exit_code.unwrap_or(default);
    let acquired = tokio::select! {
        r = acquire(&manager, &mode, (opts, no_wait), talk) => r,
        sig = signals.recv() => {
            eprintln!("moltlock: got signal {sig} while waiting for {label}; giving up");
            return Ok(signal_status(sig));
        }
    };
    let (hold, waited) = match acquired {
        Ok((Some(h), waited)) => (h, waited),
        Ok((None, _)) => {
            say_holders(&manager, &mode, "").await;
            return Ok(conflict(if one_attempt { EXIT_TIMEOUT } else { EXIT_BUSY }));
        }
        Err(Error::Timeout { waited, .. }) => {
            eprintln!(
                "moltlock: gave up waiting for {label} after {}",
                duration::format(waited)
            );
            return Ok(conflict(EXIT_TIMEOUT));
        }
        Err(e) => return Err(e.into()),
    };
    if args.verbose || (talk && waited) {
        eprintln!("moltlock: acquired {label} (fence {})", hold.fence_text());
    }
    let run = Supervised {
        hold: &hold,
        mode: &mode,
        command: &args.command,
        pass_url: args.pass_url.then_some(url),
        ttl: args.ttl,
        grace,
        at_most: args.at_most.is_some(),
    };
    let code = run.supervise(signals).await;
    release(hold, &label).await;
    Ok(code)
}

/// The acquisition's options, whether it makes one attempt only, and
/// whether that attempt is `--timeout 0` (which reports a timeout).
fn lock_options(args: &RunArgs, fair: bool) -> (LockOptions, bool, bool) {
    let mut opts = LockOptions::new();
    let one_attempt = args.timeout == Some(Duration::ZERO);
    let no_wait = args.no_wait || one_attempt;
    if no_wait {
        opts = opts.no_wait();
    } else if let Some(t) = args.timeout {
        opts = opts.timeout(t);
    }
    if fair {
        opts = opts.fair();
    }
    if let Some(least) = args.at_least {
        opts = opts.at_least(least);
    }
    if let Some(most) = args.at_most {
        opts = opts.at_most(most);
    }
    let description = args
        .value
        .clone()
        .unwrap_or_else(|| describe_self(&args.command));
    opts = opts.description(description);
    (opts, no_wait, one_attempt)
}

/// Gives the hold back after the command.
async fn release(hold: Hold, label: &str) {
    // A store that stopped answering must not keep `moltlock` from exiting:
    // the hold then lives until its TTL.
    match tokio::time::timeout(RELEASE_WAIT, hold.release()).await {
        Ok(Ok(()) | Err(Error::NotHeld { .. })) => {}
        Ok(Err(e)) => eprintln!(
            "moltlock: release of {label}: {}",
            moltlock::redact(&e.to_string())
        ),
        Err(_) => eprintln!(
            "moltlock: the store did not confirm the release of {label} within {}; \
             the hold ends with its TTL",
            duration::format(RELEASE_WAIT)
        ),
    }
}

/// Acquires, and (when `talk`) says once who holds the lock if the wait
/// lasts. Returns the hold and whether it had to wait.
async fn acquire(
    manager: &LockManager,
    mode: &Mode,
    (opts, no_wait): (LockOptions, bool),
    talk: bool,
) -> Result<(Option<Hold>, bool), Error> {
    let fut = mode.acquire(manager, opts, no_wait);
    tokio::pin!(fut);
    if !talk {
        return fut.await.map(|h| (h, false));
    }
    // A short pause first: an attempt that succeeds at once must not be
    // reported as a wait (nor our own new hold as someone else's).
    tokio::select! {
        r = &mut fut => return r.map(|h| (h, false)),
        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
    }
    let notice = async {
        say_holders(manager, mode, "; waiting").await;
        std::future::pending::<()>().await;
    };
    tokio::select! {
        r = &mut fut => r.map(|h| (h, true)),
        () = notice => unreachable_pending(),
    }
}

/// Says who holds the lock (each busy part, for a semaphore, a read-write
/// lock or several keys), or that it is held elsewhere; `then` ends each line.
async fn say_holders(manager: &LockManager, mode: &Mode, then: &str) {
    let holders = mode.holders(manager).await;
    if holders.is_empty() {
        let label = mode.label();
        match then {
            "" => eprintln!("moltlock: {label} is held elsewhere"),
            _ => eprintln!("moltlock: waiting for {label}"),
        }
    }
    for (part, h) in holders {
        eprintln!("moltlock: {part} is held by {}{then}", about(&h));
    }
}

/// The `notice` future above never completes.
fn unreachable_pending() -> Result<(Option<Hold>, bool), Error> {
    Err(Error::Config("internal: the wait notice ended".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_fits_the_ttl() {
        assert_eq!(
            max_grace(Duration::from_secs(30)),
            Duration::from_millis(14_400)
        );
        assert_eq!(
            max_grace(Duration::from_secs(10)),
            Duration::from_millis(4_800)
        );
    }
}
