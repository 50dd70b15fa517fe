//! One contender of the fault suite: takes a key again and again through
//! `moltlock::connect(url)` and, inside each critical section, writes its
//! fence to the checker's fenced resource twice (at the start and at the end
//! of the hold) and reports the section to the checker.
//!
//! ```text
//! fault-worker --url URL --key KEY --ttl-ms N --rounds N --hold-ms N
//!              --service 127.0.0.1:PORT --id NAME
//!              [--pause-round R] [--unsafe] [--gap-ms N] [--lock-timeout-ms N]
//!              [--retry-ms N] [--elect]
//! ```
//!
//! `--elect` makes the worker a candidate of an election on the key
//! instead of a plain holder: each section is one term of leadership
//! (campaign, lead, resign), its fence the term.
//!
//! `--pause-round R` makes the worker stop itself with SIGSTOP in round R,
//! right after its first write (the test resumes it with SIGCONT); the
//! second write then comes late, after the hold may have been lost.
//! `--unsafe` makes the worker ignore the validity deadline and `lost()`: it
//! reports every section as held throughout (a deliberately broken holder,
//! to show the checker catches it).

use std::time::Duration;

use moltlock::LockManager;
use moltlock_faults::{now_ns, Reporter, SectionReport};
use moltlock_fixtures::signal;

struct Args {
    url: String,
    key: String,
    ttl: Duration,
    rounds: u32,
    hold: Duration,
    service: String,
    id: String,
    pause_round: Option<u32>,
    unsafe_mode: bool,
    gap: Duration,
    lock_timeout: Duration,
    retry: Option<Duration>,
    elect: bool,
}

/// What a section holds: a plain lock or a leadership.
enum Hold {
    Lock(moltlock::LockGuard),
    Lead(moltlock::Leadership),
}

impl Hold {
    async fn take(manager: &LockManager, args: &Args) -> Result<Self, moltlock::Error> {
        if args.elect {
            let election = manager.election(&args.key)?;
            Ok(Self::Lead(election.campaign(args.id.clone()).await?))
        } else {
            Ok(Self::Lock(manager.lock(&args.key).await?))
        }
    }

    fn guard(&self) -> &moltlock::LockGuard {
        match self {
            Self::Lock(g) => g,
            Self::Lead(l) => l.guard(),
        }
    }

    async fn release(self) -> Result<(), moltlock::Error> {
        match self {
            Self::Lock(g) => g.release().await,
            Self::Lead(l) => l.resign().await,
        }
    }
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut get = std::collections::HashMap::new();
    let (mut unsafe_mode, mut elect) = (false, false);
    while let Some(flag) = it.next() {
        if flag == "--unsafe" || flag == "--elect" {
            unsafe_mode |= flag == "--unsafe";
            elect |= flag == "--elect";
            continue;
        }
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {flag}"))?
            .to_owned();
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        get.insert(name, value);
    }
    let text = |n: &str| -> Result<String, String> {
        get.get(n)
            .cloned()
            .ok_or_else(|| format!("--{n} is required"))
    };
    let num = |n: &str, default: Option<u64>| -> Result<u64, String> {
        match (get.get(n), default) {
            (Some(v), _) => v.parse().map_err(|e| format!("--{n}: {e}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("--{n} is required")),
        }
    };
    Ok(Args {
        url: text("url")?,
        key: text("key")?,
        ttl: Duration::from_millis(num("ttl-ms", None)?),
        rounds: u32::try_from(num("rounds", None)?).map_err(|e| e.to_string())?,
        hold: Duration::from_millis(num("hold-ms", None)?),
        service: text("service")?,
        id: text("id")?,
        pause_round: match get.get("pause-round") {
            Some(v) => Some(v.parse().map_err(|e| format!("--pause-round: {e}"))?),
            None => None,
        },
        unsafe_mode,
        gap: Duration::from_millis(num("gap-ms", Some(0))?),
        lock_timeout: Duration::from_millis(num("lock-timeout-ms", Some(60_000))?),
        retry: match get.get("retry-ms") {
            Some(v) => Some(Duration::from_millis(
                v.parse().map_err(|e| format!("--retry-ms: {e}"))?,
            )),
            None => None,
        },
        elect,
    })
}

/// Connects, retrying while the store is down (it may be restarting).
async fn connect(url: &str) -> Result<std::sync::Arc<dyn moltlock::Backend>, String> {
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match moltlock::connect(url).await {
            Ok(b) => return Ok(b),
            Err(e) if tokio::time::Instant::now() < until => {
                eprintln!("connect failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("connect {}: {e}", moltlock::redact_url(url))),
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let mut rep = Reporter::connect(&args.service, &args.id).await?;
    let backend = connect(&args.url).await?;
    rep.event("connected", 0, now_ns(), "").await?;
    let mut builder = LockManager::builder(backend).ttl(args.ttl);
    if let Some(every) = args.retry {
        builder = builder.retry(moltlock::RetryPolicy::Fixed(every));
    }
    let manager = builder.build().map_err(|e| e.to_string())?;
    let mut round = 0;
    while round < args.rounds {
        let hold = match tokio::time::timeout(args.lock_timeout, Hold::take(&manager, &args)).await
        {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                rep.event("error", 0, now_ns(), &e.to_string()).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => {
                rep.event("error", 0, now_ns(), "lock timed out").await?;
                continue;
            }
        };
        let guard = hold.guard();
        let fence = guard.fence().get();
        rep.event("acquired", fence, now_ns(), "").await?;
        let valid_before = guard.is_held();
        let start = now_ns();
        let first = rep.write(fence).await?;
        if args.pause_round == Some(round) {
            rep.event("pausing", fence, now_ns(), &std::process::id().to_string())
                .await?;
            signal(std::process::id(), "STOP")?;
            rep.event("resumed", fence, now_ns(), "").await?;
        }
        let mut lost_seen = false;
        // The last instant this worker saw `is_held()` true: sampled every
        // 5 ms through the hold, so its belief can be checked against others'.
        let mut last_held = if guard.is_held() { now_ns() } else { start };
        {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let lost = guard.lost();
            tokio::pin!(lost);
            let sleep = tokio::time::sleep(args.hold);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    reason = &mut lost, if !lost_seen => {
                        lost_seen = true;
                        rep.event("lost", fence, now_ns(), &reason.to_string()).await?;
                    }
                    _ = tick.tick() => {
                        if guard.is_held() {
                            last_held = now_ns();
                        }
                    }
                    _ = &mut sleep => break,
                }
            }
        }
        // The second write: late if the hold was lost meanwhile; the fenced
        // resource must refuse it once a newer holder wrote.
        let second = rep.write(fence).await?;
        let end = now_ns();
        let valid_after = guard.is_held();
        if valid_after {
            last_held = end;
        }
        let valid = args.unsafe_mode || (valid_before && valid_after);
        if args.unsafe_mode {
            last_held = end;
        }
        rep.section(&SectionReport {
            fence,
            start,
            end,
            last_held,
            valid,
            first_write: first,
            second_write: second,
        })
        .await?;
        if !lost_seen && !valid_after {
            if let Ok(reason) = tokio::time::timeout(Duration::from_secs(1), guard.lost()).await {
                rep.event("lost", fence, now_ns(), &reason.to_string())
                    .await?;
            }
        }
        let released = tokio::time::timeout(args.ttl, hold.release()).await;
        let note = match released {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        rep.event("released", fence, now_ns(), &note).await?;
        round += 1;
        if !args.gap.is_zero() {
            tokio::time::sleep(args.gap).await;
        }
    }
    rep.event("done", 0, now_ns(), "").await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args = parse()?;
    run(args).await
}
