//! `moltlock elect` (run a command only while this node leads) and
//! `moltlock leader` (who leads now, or every change).

use clap::Args;
use moltlock::{Error, Leader, LockManager};
use serde::Serialize;

use std::time::Duration;

use crate::duration;
use crate::exit::{Failure, EXIT_BUSY, EXIT_OK};
use crate::run::{self, RunArgs};
use crate::supervise::{signal_status, Signals};

/// How long `elect --keep` waits before another one-attempt campaign.
const RETRY_BUSY: Duration = Duration::from_secs(1);

/// Options of `moltlock elect`.
#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The leader's value, shown by `moltlock leader` [default: this host,
    /// pid and command].
    #[arg(long)]
    value: Option<String>,
    /// When the command ends (or leadership is lost), campaign again and
    /// run it again on winning; stops on a signal, with status 128 + the
    /// signal.
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    run: RunArgs,
}

/// Campaigns for the key (in arrival order where the store has a fair
/// queue), runs the command while leading, stops it when leadership is
/// lost; with `--keep`, over again.
pub async fn elect(url: &str, args: ElectArgs) -> Result<u8, Failure> {
    if args.run.plain_key().is_none() {
        return Err(Failure::usage(
            "elect takes one plain --key (no --permits, --shared, --exclusive or several --key)",
        ));
    }
    if let Some(value) = &args.value {
        moltlock::check_description(value).map_err(Failure::from)?;
    }
    let mut run_args = args.run;
    run_args.value = args.value;
    // The fair queue only for a campaign that waits: one that must not
    // wait takes the key or leaves.
    run_args.fair_if_any = !run_args.one_attempt();
    // One handler for every run: a signal that comes between two runs
    // ends the next one at once (128 + the signal), and the loop with it.
    let mut signals = Signals::new()?;
    loop {
        let code = run::run_with(url, run_args.clone(), &mut signals).await?;
        if !args.keep {
            return Ok(code);
        }
        // A signal ends the loop with 128 + the signal, also when the
        // command it was passed to ended with a status of its own.
        if let Some(sig) = signals.seen() {
            return Ok(signal_status(sig));
        }
        if code == EXIT_BUSY {
            // Nobody waits in a one-attempt campaign: try again later.
            tokio::select! {
                _ = tokio::time::sleep(RETRY_BUSY) => {}
                sig = signals.recv() => return Ok(signal_status(sig)),
            }
        }
    }
}

/// Options of `moltlock leader`.
#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// The election's key.
    #[arg(long)]
    key: String,
    /// Print every change of leadership until interrupted.
    #[arg(long)]
    watch: bool,
    /// Print JSON, one object per line.
    #[arg(long)]
    json: bool,
}

/// One leadership as printed.
#[derive(Serialize)]
struct Shown {
    key: String,
    leader: Option<String>,
    term: Option<u64>,
    expires_in_ms: Option<u128>,
}

fn show(key: &str, leader: Option<&Leader>, json: bool) -> Result<String, Error> {
    if json {
        let shown = Shown {
            key: key.to_string(),
            leader: leader.map(|l| l.value.clone().unwrap_or_default()),
            term: leader.and_then(|l| l.term).map(|t| t.0),
            expires_in_ms: leader.and_then(|l| l.expires_in).map(|d| d.as_millis()),
        };
        return serde_json::to_string(&shown).map_err(|e| Error::Config(e.to_string()));
    }
    Ok(match leader {
        None => format!("{key}: no leader"),
        Some(l) => {
            let term = l.term.map_or_else(|| "?".into(), |t| t.to_string());
            let left = l.expires_in.map_or_else(|| "?".into(), duration::format);
            let value = l.value.as_deref().unwrap_or("(no value)");
            format!("{key}: {value} (term {term}, {left} left)")
        }
    })
}

/// Prints the current leader (status 75 when nobody leads), or with
/// `--watch` every change until a signal.
pub async fn leader(url: &str, args: LeaderArgs) -> Result<u8, Error> {
    let manager = LockManager::new(moltlock::connect(url).await?);
    let election = manager.election(&args.key)?;
    if !args.watch {
        let now = election.leader().await?;
        println!("{}", show(&args.key, now.as_ref(), args.json)?);
        return Ok(if now.is_some() { EXIT_OK } else { EXIT_BUSY });
    }
    let mut changes = election.observe();
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(now)) => println!("{}", show(&args.key, now.as_ref(), args.json)?),
                Some(Err(e)) => eprintln!("moltlock: {}", moltlock::redact(&e.to_string())),
                None => return Ok(EXIT_OK),
            },
            _ = tokio::signal::ctrl_c() => return Ok(EXIT_OK),
        }
    }
}
