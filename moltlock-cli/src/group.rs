//! The command's process group, and the watchdog that kills it when the
//! `moltlock` process cannot.
//!
//! `moltlock run` starts a small watchdog first: this same binary, run with
//! [`WATCHDOG_ARG`], in a new process group of which it is the leader. The
//! command then starts in the watchdog's group, so every process the command
//! forks stays in a group that the watchdog can signal as a whole and that
//! cannot be recycled while the watchdog lives. The watchdog kills the group
//! with SIGKILL when
//!
//! - the `moltlock` process dies, however it dies (SIGKILL included): the
//!   kernel sends the watchdog its parent-death signal (`PR_SET_PDEATHSIG`
//!   on Linux), and its end of the pipe from `moltlock` reads end of file;
//! - the hold's local validity deadline passes without `moltlock` telling it
//!   of a renewal, for example because `moltlock` is stopped (SIGSTOP) or
//!   hung: the watchdog sends SIGTERM at the deadline minus the grace (unless
//!   `moltlock` already did), then SIGKILL at the deadline.
//!
//! Signals go through system calls (`kill(2)` on the group), not through an
//! external `kill` program.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use rustix::process::{kill_process_group, Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

/// The first argument that makes the binary a watchdog.
pub const WATCHDOG_ARG: &str = "__moltlock_watchdog";

/// Extra time the watchdog allows `moltlock` to send SIGTERM itself before
/// sending it on its behalf.
const TERM_MARGIN: Duration = Duration::from_millis(50);

/// Nanoseconds on the system-wide monotonic clock (shared by every process
/// of the machine, unlike [`Instant`]).
fn mono_now_ns() -> i128 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// `at` on the monotonic clock, in nanoseconds.
fn to_mono_ns(at: Instant) -> i128 {
    let now = Instant::now();
    let base = mono_now_ns();
    match at.checked_duration_since(now) {
        Some(ahead) => base + i128::try_from(ahead.as_nanos()).unwrap_or(i128::MAX / 2),
        None => base - i128::try_from((now - at).as_nanos()).unwrap_or(i128::MAX / 2),
    }
}

/// A monotonic-clock time in nanoseconds as an [`Instant`] of this process.
fn from_mono_ns(ns: i128) -> Instant {
    let now = Instant::now();
    let delta = ns - mono_now_ns();
    let nanos = |d: i128| Duration::from_nanos(u64::try_from(d.unsigned_abs()).unwrap_or(u64::MAX));
    if delta >= 0 {
        now.checked_add(nanos(delta))
            .unwrap_or(now + Duration::from_secs(86_400 * 365))
    } else {
        now.checked_sub(nanos(delta)).unwrap_or(now)
    }
}

/// Sends `sig` to every process of group `pgid`; a group that is already
/// gone is not an error.
pub fn signal_group(pgid: Pid, sig: Signal) {
    // ESRCH: nobody is left in the group. Nothing else can fail for a group
    // of our own children.
    let _ = kill_process_group(pgid, sig);
}

/// The watchdog, as seen from `moltlock run`.
pub struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
    pgid: Pid,
    sent: Option<(i128, i128)>,
}

impl Watchdog {
    /// Starts the watchdog in a new process group and waits until it is
    /// armed (its parent-death signal set). Call it from the thread that
    /// lives as long as the process: Linux sends the parent-death signal
    /// when the *thread* that forked the child exits.
    pub async fn start() -> std::io::Result<Self> {
        let exe = if cfg!(target_os = "linux") {
            std::path::PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe()?
        };
        let mut child = Command::new(exe)
            .arg(WATCHDOG_ARG)
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let no_pid = || std::io::Error::other("the watchdog has no process id");
        let raw = child.id().ok_or_else(no_pid)?;
        let pgid = i32::try_from(raw)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(no_pid)?;
        let stdout = child.stdout.take().ok_or_else(no_pid)?;
        let mut line = String::new();
        let ready = tokio::time::timeout(
            Duration::from_secs(10),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await;
        if !matches!(ready, Ok(Ok(_))) || line.trim() != "ready" {
            signal_group(pgid, Signal::KILL);
            let _ = child.wait().await;
            return Err(std::io::Error::other("the watchdog did not start"));
        }
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            pgid,
            sent: None,
        })
    }

    /// The process group the command must join.
    pub fn pgid(&self) -> Pid {
        self.pgid
    }

    /// The group id as the number `process_group` takes.
    pub fn pgid_raw(&self) -> i32 {
        self.pgid.as_raw_pid()
    }

    /// Tells the watchdog the hold's current local validity deadline: it
    /// sends SIGTERM at `deadline - grace` and SIGKILL at `deadline` unless
    /// told of a later one.
    pub async fn deadline(&mut self, deadline: Instant, grace: Duration) {
        let kill = to_mono_ns(deadline);
        let term = to_mono_ns(deadline.checked_sub(grace).unwrap_or(deadline));
        let term = term + i128::try_from(TERM_MARGIN.as_nanos()).unwrap_or(0);
        let term = term.min(kill);
        if let Some((k, _)) = self.sent {
            // Only news of more than a millisecond is worth a write.
            if (kill - k).abs() < 1_000_000 {
                return;
            }
        }
        self.sent = Some((kill, term));
        self.send(&format!("d {kill} {term}\n")).await;
    }

    /// Tells the watchdog that `moltlock` has sent SIGTERM itself.
    pub async fn stopping(&mut self) {
        self.send("s\n").await;
    }

    async fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                // The watchdog is gone; `exited` reports it.
                self.stdin = None;
            }
        }
    }

    /// Resolves when the watchdog process ends (it should not before
    /// [`finish`](Self::finish)).
    pub async fn exited(&mut self) {
        let _ = self.child.wait().await;
    }

    /// Kills what is left of the group (the watchdog, and any process the
    /// command left behind) and reaps the watchdog.
    pub async fn finish(mut self) {
        signal_group(self.pgid, Signal::KILL);
        self.stdin = None;
        let _ = self.child.wait().await;
    }
}

/// The watchdog process: `moltlock __moltlock_watchdog <parent pid>`.
pub fn watchdog_main(parent: Option<&str>) -> ExitCode {
    let Some(parent) = parent
        .and_then(|p| p.parse::<i32>().ok())
        .and_then(Pid::from_raw)
    else {
        eprintln!("moltlock: the watchdog needs its parent's pid");
        return ExitCode::from(crate::exit::EXIT_USAGE);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("moltlock: watchdog: cannot start the runtime: {e}");
            return ExitCode::from(crate::exit::EXIT_ERROR);
        }
    };
    runtime.block_on(watch(parent));
    // `watch` only returns after killing its own group, itself included.
    ExitCode::from(crate::exit::EXIT_ERROR)
}

/// Whether `moltlock` (the parent) still runs.
fn parent_alive(parent: Pid) -> bool {
    rustix::process::getppid() == Some(parent)
}

async fn watch(parent: Pid) {
    let me = rustix::process::getpid();
    let kill_all = |why: &str| {
        eprintln!("moltlock: {why}; killing the command");
        signal_group(me, Signal::KILL);
    };
    // Handled (and ignored) signals: `moltlock` sends SIGTERM to the whole
    // group to stop the command; the watchdog must outlive that, until the
    // final SIGKILL. The parent-death signal is SIGUSR2.
    for kind in [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ] {
        match signal(kind) {
            Ok(mut s) => {
                tokio::spawn(async move { while s.recv().await.is_some() {} });
            }
            Err(e) => return kill_all(&format!("watchdog: cannot handle signals: {e}")),
        }
    }
    let mut death = match signal(SignalKind::user_defined2()) {
        Ok(s) => s,
        Err(e) => return kill_all(&format!("watchdog: cannot handle signals: {e}")),
    };
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::USR2)) {
        return kill_all(&format!(
            "watchdog: cannot set the parent-death signal: {e}"
        ));
    }
    if !parent_alive(parent) {
        return kill_all("moltlock exited before the command started");
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout();
        if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
            return kill_all("watchdog: cannot report to moltlock");
        }
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let far = || Instant::now() + Duration::from_secs(86_400 * 365);
    let (mut kill_at, mut term_at) = (far(), far());
    let mut term_due = false;
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(l)) => match parse(&l) {
                    Some(Msg::Deadline(kill, term)) => {
                        kill_at = from_mono_ns(kill);
                        term_at = from_mono_ns(term);
                        term_due = true;
                    }
                    Some(Msg::Stopping) => term_due = false,
                    None => {}
                },
                _ => return kill_all("moltlock exited"),
            },
            _ = death.recv() => if !parent_alive(parent) {
                return kill_all("moltlock exited");
            },
            _ = poll.tick() => if !parent_alive(parent) {
                return kill_all("moltlock exited");
            },
            _ = tokio::time::sleep_until(term_at), if term_due => {
                eprintln!("moltlock: no renewal of the lock was confirmed in time; stopping the command");
                signal_group(me, Signal::TERM);
                term_due = false;
            }
            _ = tokio::time::sleep_until(kill_at) => {
                return kill_all("the lock's validity deadline passed without a confirmed renewal");
            }
        }
    }
}

enum Msg {
    Deadline(i128, i128),
    Stopping,
}

fn parse(line: &str) -> Option<Msg> {
    let mut parts = line.split_whitespace();
    match parts.next()? {
        "d" => {
            let kill = parts.next()?.parse().ok()?;
            let term = parts.next()?.parse().ok()?;
            Some(Msg::Deadline(kill, term))
        }
        "s" => Some(Msg::Stopping),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_round_trip() {
        let at = Instant::now() + Duration::from_secs(5);
        let back = from_mono_ns(to_mono_ns(at));
        let diff = if back > at { back - at } else { at - back };
        assert!(diff < Duration::from_millis(50), "{diff:?}");
    }

    #[test]
    fn messages_parse() {
        assert!(matches!(parse("d 10 5"), Some(Msg::Deadline(10, 5))));
        assert!(matches!(parse("s"), Some(Msg::Stopping)));
        assert!(parse("x").is_none());
        assert!(parse("d 1").is_none());
    }
}
