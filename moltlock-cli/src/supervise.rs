//! The command under a hold: started in its own process group with a
//! watchdog, and stopped before the hold could pass to anyone else.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use moltlock::LostReason;
use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::duration;
use crate::exit::{Failure, EXIT_ERROR, EXIT_LOST, EXIT_USAGE};
use crate::group::{signal_group, Watchdog};
use crate::hold::Hold;
use crate::mode::Mode;

/// Signals `moltlock run` handles: SIGINT is passed on as SIGINT; SIGTERM,
/// SIGHUP and SIGQUIT stop the command with SIGTERM.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    /// The last signal received, if any.
    seen: Option<i32>,
}

impl Signals {
    /// Starts handling the signals.
    ///
    /// # Errors
    /// A failure when a handler cannot be installed.
    pub fn new() -> Result<Self, Failure> {
        let on =
            |kind| signal(kind).map_err(|e| Failure::error(format!("cannot handle signals: {e}")));
        Ok(Self {
            term: on(SignalKind::terminate())?,
            int: on(SignalKind::interrupt())?,
            hup: on(SignalKind::hangup())?,
            quit: on(SignalKind::quit())?,
            seen: None,
        })
    }

    /// The next signal received, as its number.
    pub async fn recv(&mut self) -> i32 {
        let sig = tokio::select! {
            _ = self.term.recv() => Signal::TERM.as_raw(),
            _ = self.int.recv() => Signal::INT.as_raw(),
            _ = self.hup.recv() => Signal::HUP.as_raw(),
            _ = self.quit.recv() => Signal::QUIT.as_raw(),
        };
        self.seen = Some(sig);
        sig
    }

    /// The last signal [`recv`](Self::recv) returned, if any.
    pub fn seen(&self) -> Option<i32> {
        self.seen
    }
}

/// Why the command is being stopped.
enum Stop {
    /// The deadline minus the grace came without a confirmed renewal.
    Deadline,
    /// A part of the hold was lost: its store key and why.
    Lost(String, LostReason),
    /// `moltlock` got this signal.
    Signal(i32),
    /// Someone asked the holder to release (`moltlock revoke --ask`).
    Asked,
    /// The watchdog ended on its own.
    Watchdog,
}

/// A command to run under a hold.
pub struct Supervised<'a> {
    /// The hold.
    pub hold: &'a Hold,
    /// The lock it is of, for messages and the command's environment.
    pub mode: &'a Mode,
    /// The command and its arguments.
    pub command: &'a [String],
    /// The store URL to pass as MOLTLOCK_URL, if it is to be passed.
    pub pass_url: Option<&'a str>,
    /// The hold's TTL.
    pub ttl: Duration,
    /// The time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// The hold has an `--at-most` time (its deadline may be that time).
    pub at_most: bool,
}

impl Supervised<'_> {
    /// Runs the command to its end, or stops it when the hold ends, a
    /// signal comes or the watchdog ends; returns the status to report.
    pub async fn supervise(&self, signals: &mut Signals) -> u8 {
        let mut watchdog = match Watchdog::start().await {
            Ok(w) => w,
            Err(e) => {
                eprintln!("moltlock: cannot start the command's watchdog: {e}");
                return EXIT_ERROR;
            }
        };
        // The watchdog knows the deadline before the command starts.
        if let Some(left) = self.hold.valid_for() {
            watchdog.deadline(Instant::now() + left, self.grace).await;
        }
        let mut child = match self.spawn(watchdog.pgid_raw()) {
            Ok(c) => c,
            Err(code) => {
                watchdog.finish().await;
                return code;
            }
        };
        let (stop, deadline) = match self.watch(&mut child, &mut watchdog, signals).await {
            Ok(status) => {
                watchdog.finish().await;
                return self.finished(status);
            }
            Err(stopped) => stopped,
        };
        let code = self
            .stop(&mut child, &mut watchdog, signals, (stop, deadline))
            .await;
        watchdog.finish().await;
        code
    }

    /// Passes renewed deadlines on to the watchdog until the command ends
    /// (its status) or must be stopped (why, and the hold's deadline).
    async fn watch(
        &self,
        child: &mut Child,
        watchdog: &mut Watchdog,
        signals: &mut Signals,
    ) -> Result<std::io::Result<ExitStatus>, (Stop, Instant)> {
        // Wake up often enough to pass renewed deadlines on to the watchdog
        // well before its stale one comes.
        let tick = (self.ttl / 12).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut deadline = Instant::now();
        loop {
            let now = Instant::now();
            let Some(left) = self.hold.valid_for() else {
                let reason = self.hold.lost_reason();
                return Err((Stop::Lost(String::new(), reason), deadline));
            };
            deadline = now + left;
            if left <= self.grace {
                return Err((Stop::Deadline, deadline));
            }
            watchdog.deadline(deadline, self.grace).await;
            let wake = (left - self.grace).min(tick);
            tokio::select! {
                biased;
                status = child.wait() => return Ok(status),
                (key, reason) = self.hold.lost() => {
                    return Err((Stop::Lost(key.to_string(), reason), deadline));
                }
                sig = signals.recv() => return Err((Stop::Signal(sig), deadline)),
                () = self.hold.release_requested() => return Err((Stop::Asked, deadline)),
                () = watchdog.exited() => return Err((Stop::Watchdog, deadline)),
                () = tokio::time::sleep(wake) => {}
            }
        }
    }

    /// Stops the command's group: the first signal now, SIGKILL no later
    /// than the hold's local validity deadline.
    async fn stop(
        &self,
        child: &mut Child,
        watchdog: &mut Watchdog,
        signals: &mut Signals,
        (stop, deadline): (Stop, Instant),
    ) -> u8 {
        let (first, kill_at, code) = self.plan(&stop, deadline);
        let pgid: Pid = watchdog.pgid();
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
        code.unwrap_or_else(|| exit_code(status))
    }

    /// The first signal, when SIGKILL follows, and the status to report
    /// (`None`: the command's own), saying why the command is stopped.
    fn plan(&self, stop: &Stop, deadline: Instant) -> (Signal, Instant, Option<u8>) {
        let now = Instant::now();
        let after_grace = deadline.min(now + self.grace);
        let label = self.mode.label();
        match stop {
            Stop::Deadline => {
                let why = if self.at_most {
                    "its --at-most time is up, or no renewal was confirmed in time"
                } else {
                    "no renewal was confirmed in time"
                };
                eprintln!(
                    "moltlock: {label}: {why} ({} left, --grace {}); \
                     stopping the command: SIGTERM now, SIGKILL at the deadline",
                    duration::format(deadline.saturating_duration_since(now)),
                    duration::format(self.grace)
                );
                (Signal::TERM, deadline, Some(EXIT_LOST))
            }
            Stop::Lost(key, reason) => {
                let part = if key.is_empty() {
                    label
                } else {
                    self.mode.part(key)
                };
                eprintln!("moltlock: lost the lock on {part} ({reason}); stopping the command");
                (Signal::TERM, after_grace, Some(EXIT_LOST))
            }
            Stop::Signal(sig) => {
                let first = if *sig == Signal::INT.as_raw() {
                    Signal::INT
                } else {
                    Signal::TERM
                };
                (first, after_grace, None)
            }
            Stop::Asked => {
                eprintln!(
                    "moltlock: {label}: asked to release; stopping the command: SIGTERM now, \
                     SIGKILL after --grace {}",
                    duration::format(self.grace)
                );
                (Signal::TERM, after_grace, None)
            }
            Stop::Watchdog => {
                eprintln!("moltlock: the command's watchdog ended; stopping the command");
                (Signal::TERM, after_grace, Some(EXIT_ERROR))
            }
        }
    }

    /// The status for a command that ended on its own; 125 when the hold
    /// ended while it ran (the watchdog may have killed it while `moltlock`
    /// was stopped).
    fn finished(&self, status: std::io::Result<ExitStatus>) -> u8 {
        if !self.hold.is_held() {
            eprintln!(
                "moltlock: the lock on {} ended while the command ran ({})",
                self.mode.label(),
                self.hold.lost_reason()
            );
            return EXIT_LOST;
        }
        exit_code(status)
    }

    fn spawn(&self, pgid: i32) -> Result<Child, u8> {
        let Some((program, rest)) = self.command.split_first() else {
            return Err(EXIT_USAGE);
        };
        let mut cmd = Command::new(program);
        cmd.args(rest).env_remove("MOLTLOCK_URL");
        // A run inside another run is told only of its own hold.
        for var in inherited_hold_vars() {
            cmd.env_remove(var);
        }
        cmd.envs(self.hold.env(self.mode.name()))
            .process_group(pgid);
        if let Some(url) = self.pass_url {
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
}

/// The variables an outer `moltlock run` may have set about its hold.
fn inherited_hold_vars() -> Vec<std::ffi::OsString> {
    let ours = |name: &str| {
        ["MOLTLOCK_KEY", "MOLTLOCK_FENCE"]
            .iter()
            .any(|p| name.starts_with(p))
            || ["MOLTLOCK_SLOT", "MOLTLOCK_MODE"].contains(&name)
    };
    std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_str().is_some_and(ours))
        .collect()
}

/// 128 + the signal's number, as shells report it.
pub fn signal_status(sig: i32) -> u8 {
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
