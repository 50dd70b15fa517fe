//! `moltlock run`: hold a lock while a command runs.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use moltlock::{Error, LockGuard, LockManager, LockOptions};
use tokio::process::{Child, Command};

use crate::{parse_duration, EXIT_BUSY, EXIT_LOST, EXIT_TIMEOUT};

/// Options of `moltlock run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The lock's key.
    #[arg(long)]
    key: String,
    /// The lock's TTL; it is renewed every TTL/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Wait for the lock (the default).
    #[arg(long, conflicts_with = "no_wait")]
    wait: bool,
    /// Fail at once (status 75) when the lock is held elsewhere.
    #[arg(long)]
    no_wait: bool,
    /// Give up waiting after this long (status 124).
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    timeout: Option<Duration>,
    /// After a lost lock, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs the command under the lock; returns the exit status to report.
pub async fn run(url: &str, args: RunArgs) -> Result<u8, Error> {
    let manager = LockManager::builder_arc(moltlock::connect(url).await?)
        .ttl(args.ttl)
        .build()?;
    let mut opts = LockOptions::new();
    if args.no_wait {
        opts = opts.no_wait();
    }
    if let Some(t) = args.timeout {
        opts = opts.timeout(t);
    }
    let guard = match manager.acquire(&args.key, opts).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            eprintln!("moltlock: {:?} is held elsewhere", args.key);
            return Ok(EXIT_BUSY);
        }
        Err(Error::Timeout { waited, .. }) => {
            eprintln!(
                "moltlock: gave up waiting for {:?} after {}",
                args.key,
                crate::duration::format(waited)
            );
            return Ok(EXIT_TIMEOUT);
        }
        Err(e) => return Err(e),
    };
    let code = supervise(&guard, &args).await;
    if let Err(e) = guard.release().await {
        eprintln!("moltlock: release of {:?}: {e}", args.key);
    }
    Ok(code)
}

async fn supervise(guard: &LockGuard, args: &RunArgs) -> u8 {
    let mut child = match spawn(guard, &args.command) {
        Ok(c) => c,
        Err(code) => return code,
    };
    tokio::select! {
        status = child.wait() => exit_code(status),
        reason = guard.lost() => {
            eprintln!(
                "moltlock: lost the lock on {:?} ({reason}); stopping the command",
                args.key
            );
            stop(&mut child, args.grace).await;
            EXIT_LOST
        }
        _ = shutdown() => {
            signal(&child, "TERM");
            let status = tokio::time::timeout(args.grace, child.wait()).await;
            match status {
                Ok(s) => exit_code(s),
                Err(_) => {
                    stop(&mut child, Duration::ZERO).await;
                    128 + 9
                }
            }
        }
    }
}

fn spawn(guard: &LockGuard, command: &[String]) -> Result<Child, u8> {
    let Some((program, rest)) = command.split_first() else {
        return Err(crate::EXIT_ERROR);
    };
    let spawned = Command::new(program)
        .args(rest)
        .env("MOLTLOCK_KEY", guard.key().as_str())
        .env("MOLTLOCK_FENCE", guard.fence().to_string())
        .spawn();
    spawned.map_err(|e| {
        eprintln!("moltlock: cannot run {program:?}: {e}");
        match e.kind() {
            std::io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    })
}

fn exit_code(status: std::io::Result<ExitStatus>) -> u8 {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => u8::try_from(code).unwrap_or(1),
            (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
            (None, None) => 1,
        },
        Err(e) => {
            eprintln!("moltlock: waiting for the command: {e}");
            crate::EXIT_ERROR
        }
    }
}

/// Sends a signal by name to the child, if it still runs.
fn signal(child: &Child, sig: &str) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-s", sig, &pid.to_string()])
            .status();
    }
}

/// SIGTERM, up to `grace` to exit, then SIGKILL.
async fn stop(child: &mut Child, grace: Duration) {
    signal(child, "TERM");
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// Resolves on SIGINT or SIGTERM to this process.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
