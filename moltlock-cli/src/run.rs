//! `moltlock run`: hold a lock while a command runs, and never let the
//! command run on without it.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use moltlock::{Error, LockGuard, LockManager, LockOptions, LostReason};
use rustix::process::Signal;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::duration;
use crate::exit::{Failure, EXIT_BUSY, EXIT_ERROR, EXIT_LOST, EXIT_TIMEOUT, EXIT_USAGE};
use crate::group::{signal_group, Watchdog};

/// The clock-drift allowance the manager is built with: a hold is trusted
/// locally for `ttl × (1 − DRIFT)` after the request that confirmed it.
const DRIFT: f64 = 0.02;
/// The grace when `--grace` is not given (shortened to fit the TTL).
const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// How long the release after the command may take.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Options of `moltlock run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The lock's key.
    #[arg(long)]
    key: String,
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
    /// Wait in a fair (arrival-order) queue; only for stores that have one
    /// (etcd).
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

/// Signals `moltlock run` handles: SIGINT is passed on as SIGINT; SIGTERM,
/// SIGHUP and SIGQUIT stop the command with SIGTERM.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let on =
            |kind| signal(kind).map_err(|e| Failure::error(format!("cannot handle signals: {e}")));
        Ok(Self {
            term: on(SignalKind::terminate())?,
            int: on(SignalKind::interrupt())?,
            hup: on(SignalKind::hangup())?,
            quit: on(SignalKind::quit())?,
        })
    }

    /// The next signal received, as its number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.term.recv() => Signal::TERM.as_raw(),
            _ = self.int.recv() => Signal::INT.as_raw(),
            _ = self.hup.recv() => Signal::HUP.as_raw(),
            _ = self.quit.recv() => Signal::QUIT.as_raw(),
        }
    }
}

/// Runs the command under the lock; returns the exit status to report.
pub async fn run(url: &str, args: RunArgs) -> Result<u8, Failure> {
    let grace = grace(&args)?;
    let mut signals = Signals::new()?;
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
            "--fair needs a store with a fair queue (etcd); {} has none",
            manager.backend().name()
        )));
    }
    let talk = args.verbose || std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut opts = LockOptions::new();
    // `--timeout 0` is one attempt, as --no-wait, but reports a timeout.
    let one_attempt = args.timeout == Some(Duration::ZERO);
    if args.no_wait || one_attempt {
        opts = opts.no_wait();
    } else if let Some(t) = args.timeout {
        opts = opts.timeout(t);
    }
    if args.fair {
        opts = opts.fair();
    }
    opts = opts.description(describe_self(&args.command));
    let conflict = |default: u8| args.conflict_exit_code.unwrap_or(default);
    let acquired = tokio::select! {
        r = acquire(&manager, &args.key, opts, talk) => r,
        sig = signals.recv() => {
            eprintln!("moltlock: got signal {sig} while waiting for {:?}; giving up", args.key);
            return Ok(signal_status(sig));
        }
    };
    let (guard, waited) = match acquired {
        Ok((Some(g), waited)) => (g, waited),
        Ok((None, _)) => {
            match holder_of(&manager, &args.key).await {
                Some(h) => eprintln!("moltlock: {:?} is held by {}", args.key, about(&h)),
                None => eprintln!("moltlock: {:?} is held elsewhere", args.key),
            }
            return Ok(conflict(if one_attempt { EXIT_TIMEOUT } else { EXIT_BUSY }));
        }
        Err(Error::Timeout { waited, .. }) => {
            eprintln!(
                "moltlock: gave up waiting for {:?} after {}",
                args.key,
                duration::format(waited)
            );
            return Ok(conflict(EXIT_TIMEOUT));
        }
        Err(e) => return Err(e.into()),
    };
    if args.verbose || (talk && waited) {
        eprintln!(
            "moltlock: acquired {:?} (fence {})",
            args.key,
            guard.fence()
        );
    }
    let code = supervise(&guard, &args, url, grace, &mut signals).await;
    // A store that stopped answering must not keep `moltlock` from exiting:
    // the hold then lives until its TTL.
    match tokio::time::timeout(RELEASE_WAIT, guard.release()).await {
        Ok(Ok(()) | Err(Error::NotHeld { .. })) => {}
        Ok(Err(e)) => eprintln!(
            "moltlock: release of {:?}: {}",
            args.key,
            moltlock::redact(&e.to_string())
        ),
        Err(_) => eprintln!(
            "moltlock: the store did not confirm the release of {:?} within {}; \
             the hold ends with its TTL",
            args.key,
            duration::format(RELEASE_WAIT)
        ),
    }
    Ok(code)
}

/// Acquires, and (when `talk`) says once who holds the key if the wait
/// lasts. Returns the guard and whether it had to wait.
async fn acquire(
    manager: &LockManager,
    key: &str,
    opts: LockOptions,
    talk: bool,
) -> Result<(Option<LockGuard>, bool), Error> {
    let fut = manager.acquire(key, opts);
    tokio::pin!(fut);
    if !talk {
        return fut.await.map(|g| (g, false));
    }
    // A short pause first: an attempt that succeeds at once must not be
    // reported as a wait (nor our own new hold as someone else's).
    tokio::select! {
        r = &mut fut => return r.map(|g| (g, false)),
        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
    }
    let notice = async {
        match holder_of(manager, key).await {
            Some(h) => eprintln!("moltlock: {key:?} is held by {}; waiting", about(&h)),
            None => eprintln!("moltlock: waiting for {key:?}"),
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        r = &mut fut => r.map(|g| (g, true)),
        () = notice => unreachable_pending(),
    }
}

/// The current holder of `key`, where the store can tell.
async fn holder_of(manager: &LockManager, key: &str) -> Option<moltlock::HolderInfo> {
    let k = moltlock::LockKey::new(key).ok()?;
    let inspector = manager.backend().inspector()?;
    inspector.inspect(&k).await.ok().flatten()
}

/// `host h pid p since t: command (abcdef12…, fence f, 12.3s left)`.
fn about(h: &moltlock::HolderInfo) -> String {
    let token: String = h.holder.as_str().chars().take(8).collect();
    let fence = h.fence.map(|f| format!(", fence {f}")).unwrap_or_default();
    let left = h
        .expires_in
        .map(|d| format!(", {} left", duration::format(d)))
        .unwrap_or_default();
    match &h.description {
        Some(d) => format!("{d} ({token}…{fence}{left})"),
        None => format!("{token}…{fence}{left}"),
    }
}

/// What this run stores with its hold: host, pid, start time and command,
/// cut to the description limit.
fn describe_self(command: &[String]) -> String {
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let since = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    // The store keeps this text where anyone who can list holds reads it:
    // credentials in the command line stay out.
    let text = format!(
        "host {host} pid {} since {since}: {}",
        std::process::id(),
        moltlock::redact(&command.join(" "))
    );
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut end = clean.len().min(moltlock::MAX_DESCRIPTION_LEN);
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    clean[..end].to_owned()
}

/// The `notice` future above never completes.
fn unreachable_pending() -> Result<(Option<LockGuard>, bool), Error> {
    Err(Error::Config("internal: the wait notice ended".into()))
}

/// Why the command is being stopped.
enum Stop {
    /// The deadline minus the grace came without a confirmed renewal.
    Deadline,
    /// The hold was lost.
    Lost(LostReason),
    /// `moltlock` got this signal.
    Signal(i32),
    /// The watchdog ended on its own.
    Watchdog,
}

async fn supervise(
    guard: &LockGuard,
    args: &RunArgs,
    url: &str,
    grace: Duration,
    signals: &mut Signals,
) -> u8 {
    let mut watchdog = match Watchdog::start().await {
        Ok(w) => w,
        Err(e) => {
            eprintln!("moltlock: cannot start the command's watchdog: {e}");
            return EXIT_ERROR;
        }
    };
    // The watchdog knows the deadline before the command starts.
    if let Some(left) = guard.valid_for() {
        watchdog.deadline(Instant::now() + left, grace).await;
    }
    let mut child = match spawn(guard, args, url, watchdog.pgid_raw()) {
        Ok(c) => c,
        Err(code) => {
            watchdog.finish().await;
            return code;
        }
    };
    let pgid = watchdog.pgid();
    // Wake up often enough to pass renewed deadlines on to the watchdog
    // well before its stale one comes.
    let tick = (guard.ttl() / 12).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut deadline = Instant::now();
    let stop = loop {
        let now = Instant::now();
        let Some(left) = guard.valid_for() else {
            break Stop::Lost(lost_reason(guard));
        };
        deadline = now + left;
        if left <= grace {
            break Stop::Deadline;
        }
        watchdog.deadline(deadline, grace).await;
        let wake = (left - grace).min(tick);
        tokio::select! {
            biased;
            status = child.wait() => {
                watchdog.finish().await;
                return finished(guard, args, status);
            }
            reason = guard.lost() => break Stop::Lost(reason),
            sig = signals.recv() => break Stop::Signal(sig),
            () = watchdog.exited() => break Stop::Watchdog,
            () = tokio::time::sleep(wake) => {}
        }
    };
    let now = Instant::now();
    // SIGKILL lands no later than the hold's local validity deadline.
    let (first, kill_at, code) = match &stop {
        Stop::Deadline => {
            eprintln!(
                "moltlock: no renewal of {:?} confirmed in time ({} left, --grace {}); \
                 stopping the command: SIGTERM now, SIGKILL at the deadline",
                args.key,
                duration::format(deadline.saturating_duration_since(now)),
                duration::format(grace)
            );
            (Signal::TERM, deadline, Some(EXIT_LOST))
        }
        Stop::Lost(reason) => {
            eprintln!(
                "moltlock: lost the lock on {:?} ({reason}); stopping the command",
                args.key
            );
            (Signal::TERM, deadline.min(now + grace), Some(EXIT_LOST))
        }
        Stop::Signal(sig) => {
            let first = if *sig == Signal::INT.as_raw() {
                Signal::INT
            } else {
                Signal::TERM
            };
            (first, deadline.min(now + grace), None)
        }
        Stop::Watchdog => {
            eprintln!("moltlock: the command's watchdog ended; stopping the command");
            (Signal::TERM, deadline.min(now + grace), Some(EXIT_ERROR))
        }
    };
    signal_group(pgid, first);
    watchdog.stopping().await;
    let status = tokio::select! {
        s = child.wait() => s,
        () = tokio::time::sleep_until(kill_at) => {
            signal_group(pgid, Signal::KILL);
            child.wait().await
        }
        // A second signal does not wait for the grace.
        _ = signals.recv() => {
            signal_group(pgid, Signal::KILL);
            child.wait().await
        }
    };
    watchdog.finish().await;
    code.unwrap_or_else(|| exit_code(status))
}

fn lost_reason(guard: &LockGuard) -> LostReason {
    match guard.check() {
        Err(Error::Lost { reason, .. }) => reason,
        _ => LostReason::Deadline,
    }
}

/// The status for a command that ended on its own; 125 when the hold ended
/// while it ran (the watchdog may have killed it while `moltlock` was
/// stopped).
fn finished(guard: &LockGuard, args: &RunArgs, status: std::io::Result<ExitStatus>) -> u8 {
    if !guard.is_held() {
        eprintln!(
            "moltlock: the lock on {:?} ended while the command ran ({})",
            args.key,
            lost_reason(guard)
        );
        return EXIT_LOST;
    }
    exit_code(status)
}

fn spawn(guard: &LockGuard, args: &RunArgs, url: &str, pgid: i32) -> Result<Child, u8> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(EXIT_USAGE);
    };
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env_remove("MOLTLOCK_URL")
        .env("MOLTLOCK_KEY", guard.key().as_str())
        .env("MOLTLOCK_FENCE", guard.fence().to_string())
        .process_group(pgid);
    if args.pass_url {
        cmd.env("MOLTLOCK_URL", url);
    }
    cmd.spawn().map_err(|e| {
        eprintln!("moltlock: cannot run {program:?}: {e}");
        match e.kind() {
            std::io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    })
}

/// 128 + the signal's number, as shells report it.
fn signal_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

fn exit_code(status: std::io::Result<ExitStatus>) -> u8 {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => u8::try_from(code).unwrap_or(1),
            (None, Some(sig)) => signal_status(sig),
            (None, None) => 1,
        },
        Err(e) => {
            eprintln!("moltlock: waiting for the command: {e}");
            EXIT_ERROR
        }
    }
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
