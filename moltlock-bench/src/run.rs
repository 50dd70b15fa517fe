//! The command line and the order of a run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clap::{Parser, ValueEnum};
use moltlock::{Backend, Store};

use crate::counting::{CountReader, Counting};
use crate::floor::Floor;
use crate::molt::MoltLocker;
use crate::peers::{EtcdLockRpc, Rslock};
use crate::report::{BackendReport, PeerReport, Report, Settings};
use crate::stats::{ratio, Summary};
use crate::target::{etcd_prefix, Target};
use crate::workload::{
    closed_loop, contended, paired, Bounds, Contention, Cycler, KeyFn, Locker, LockerCycler,
    KEYS_PER_TASK,
};

/// Measures every backend against the raw store round trip and against the
/// locks users would pick instead.
#[derive(Parser, Debug, Clone)]
#[command(name = "moltlock-bench", version)]
pub struct Args {
    /// A store to measure (repeat for several): sqlite://…, redis://…,
    /// postgres://…, mysql://…, etcd://host:port.
    #[arg(long = "url", required = true)]
    pub urls: Vec<String>,
    /// Wall-clock budget of each measurement (e.g. 3s, 500ms).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Most cycles per measurement (a bound besides the duration).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_cycles: u64,
    /// Tasks of the parallel loop.
    #[arg(long, default_value_t = 32)]
    pub tasks: usize,
    /// Rounds of the throughput section's parallel loops: the floor and
    /// MoltLock take turns (A B B A …), each round a share of `--duration`,
    /// so a machine whose speed drifts during the run weighs on both alike.
    /// (One task alternates cycle by cycle.)
    #[arg(long, default_value_t = 4)]
    pub rounds: u32,
    /// Tasks competing for one key.
    #[arg(long, default_value_t = 8)]
    pub contenders: usize,
    /// How long each contender holds the key.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub hold: Duration,
    /// Locks held in the renewal section (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub locks: usize,
    /// TTL of the renewal section's holds (renewed every TTL/3; raised to
    /// the backend's shortest TTL).
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub renew_ttl: Duration,
    /// Permits of the semaphore section's semaphore (it runs with one task
    /// and with `--contenders` tasks).
    #[arg(long, default_value_t = 4)]
    pub permits: u32,
    /// Keys per `lock_all` in the multi-lock section.
    #[arg(long, default_value_t = 4)]
    pub multi_keys: usize,
    /// Measure only these sections (comma-separated; default: all). The
    /// round trips (a command of the floor, and a bare one) are measured
    /// always; `--peers` runs the peers either way.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// Also run the peers: rslock on Redis URLs, etcd's Lock RPC on etcd URLs.
    #[arg(long)]
    pub peers: bool,
    /// Print JSON instead of markdown.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Write the hand-off latency chart (SVG) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Only take `--locks` locks on the first `--url` in this process and
    /// print the resident bytes added per lock (the renewal section runs
    /// this in a child process; see `memory`).
    #[arg(long, hide = true)]
    pub memory_probe: bool,
    /// The run id to write under (a fresh one by default; the memory probe
    /// writes in its parent's key space): letters, digits and `-`.
    #[arg(long, hide = true, value_parser = parse_run_id)]
    pub run_id: Option<String>,
}

/// A part of a backend's run, for `--only`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The floor, one task and many on distinct keys.
    Throughput,
    /// Tasks contending for one key (default and fair mode).
    Contended,
    /// Many locks held across renewal intervals (`--locks`).
    Renewal,
    /// A semaphore next to a plain lock, one task and many.
    Semaphore,
    /// `lock_all`, with and without the backend's `cas_multi`.
    LockAll,
}

impl Section {
    /// Every section, in run order.
    pub const ALL: [Section; 5] = [
        Section::Throughput,
        Section::Contended,
        Section::Renewal,
        Section::Semaphore,
        Section::LockAll,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Section::Throughput => "throughput",
            Section::Contended => "contended",
            Section::Renewal => "renewal",
            Section::Semaphore => "semaphore",
            Section::LockAll => "lock-all",
        }
    }
}

impl Args {
    /// Whether the run measures `section`.
    pub fn runs(&self, section: Section) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }

    /// The sections measured, in run order.
    pub fn sections(&self) -> Vec<Section> {
        Section::ALL.into_iter().filter(|s| self.runs(*s)).collect()
    }
}

/// A run id as given: 1 to 64 ASCII letters, digits and `-` (it goes into
/// keys, and a cleanup matches keys by it).
///
/// # Errors
/// A message for anything else.
pub fn parse_run_id(s: &str) -> Result<String, String> {
    let ok =
        (1..=64).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    match ok {
        true => Ok(s.to_owned()),
        false => Err(format!(
            "not a run id: {s:?} (1 to 64 letters, digits and -)"
        )),
    }
}

/// Parses `250ms`, `3s`, `1.5s`, `2m` or a bare number of seconds.
///
/// # Errors
/// A message for anything else.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (try 3s or 500ms)"))?;
    let secs = match unit {
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("unknown unit in {s:?}: use us, ms, s or m")),
    };
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("duration out of range: {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The floor's commands, each timed: one task takes a free key and
/// releases it, again and again within `bounds`, and every take and every
/// release is one sample. The task is spawned on the runtime's workers, as
/// every measured loop is (a loop on the thread that blocks on the run
/// would pay a thread hop per reply).
async fn floor_commands(floor: &Floor, key: &KeyFn, bounds: Bounds) -> Result<Summary, String> {
    let (floor, key) = (floor.clone(), key.clone());
    let timed = tokio::spawn(async move {
        let deadline = std::time::Instant::now() + bounds.duration;
        let mut times = Vec::new();
        let mut cycle = 0u64;
        while cycle < bounds.max_cycles && std::time::Instant::now() < deadline {
            let (take, release) = floor.timed_cycle(&key(0, cycle % KEYS_PER_TASK)).await?;
            times.extend([take, release]);
            cycle += 1;
        }
        Ok::<_, String>(times)
    });
    let mut times = timed.await.map_err(|e| e.to_string())??;
    Ok(Summary::of(&mut times))
}

/// A bare round trip as a "cycle".
struct Rtt(Floor);

#[async_trait]
impl Cycler for Rtt {
    async fn cycle(&self, _key: &str) -> Result<(), String> {
        self.0.round_trip().await
    }
}

fn bounds(a: &Args) -> Bounds {
    Bounds {
        duration: a.duration,
        max_cycles: a.max_cycles,
    }
}

fn contention(a: &Args) -> Contention {
    Contention {
        duration: a.duration,
        hold: a.hold,
        max_acquisitions: a.max_cycles,
        grace: Duration::from_secs(5) + a.duration,
    }
}

fn keys(t: &Target, section: &'static str) -> KeyFn {
    let t = t.clone();
    Arc::new(move |task, slot| t.key(section, format!("{task}-{slot}")))
}

/// Runs every measurement the arguments ask for.
pub async fn run(a: &Args) -> Report {
    let run_id = a
        .run_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let mut report = Report {
        settings: Settings {
            duration_ms: a.duration.as_millis() as u64,
            parallel_tasks: a.tasks,
            rounds: a.rounds,
            contenders: a.contenders,
            hold_us: a.hold.as_micros() as u64,
            renewal_locks: a.locks,
            renewal_ttl_ms: a.renew_ttl.as_millis() as u64,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            sections: a.sections().iter().map(|s| s.name().to_owned()).collect(),
            permits: a.permits,
            multi_keys: a.multi_keys,
        },
        ..Report::default()
    };
    let mut targets = Vec::new();
    for url in &a.urls {
        match Target::new(url, &run_id) {
            Ok(t) => targets.push(t),
            Err(e) => report.backends.push(BackendReport {
                store: "unknown".into(),
                error: Some(e),
                ..BackendReport::default()
            }),
        }
    }
    for t in &targets {
        eprintln!("moltlock-bench: measuring {}", t.label());
        report.backends.push(run_backend(t, a).await);
    }
    if a.peers {
        for t in &targets {
            if let Some(p) = run_peer(t, a).await {
                report.peers.push(p);
            }
        }
    }
    report.check();
    report
}

async fn run_backend(t: &Target, a: &Args) -> BackendReport {
    let mut r = BackendReport {
        store: t.label().to_owned(),
        ..BackendReport::default()
    };
    if let Err(e) = measure(t, a, &mut r).await {
        eprintln!("moltlock-bench: {}: {e}", t.label());
        r.error = Some(e);
    }
    r
}

async fn measure(t: &Target, a: &Args, r: &mut BackendReport) -> Result<(), String> {
    let backend = t.backend().await?;
    let floor = Floor::connect(t).await?;
    let res = measure_with(t, a, r, backend, &floor).await;
    let cleaned = floor.cleanup().await;
    let forgotten = floor.forget_run(t).await;
    res.and(cleaned).and(forgotten)
}

async fn measure_with(
    t: &Target,
    a: &Args,
    r: &mut BackendReport,
    backend: Arc<dyn Backend>,
    floor: &Floor,
) -> Result<(), String> {
    let rtt_bounds = Bounds {
        duration: a.duration / 2,
        max_cycles: a.max_cycles,
    };
    r.bare_rtt = closed_loop(Arc::new(Rtt(floor.clone())), keys(t, "rtt"), 1, rtt_bounds)
        .await?
        .latency;
    r.rtt = floor_commands(floor, &keys(t, "rtt-floor"), rtt_bounds).await?;
    if a.runs(Section::Throughput) {
        throughput(t, a, r, backend.clone(), floor).await?;
    }
    if a.runs(Section::Contended) {
        r.contended = Some(contend_molt(t, a, false).await?);
        r.contended_shared = Some(contend_shared(t, a).await?);
        if backend.fair_queue().is_some() {
            r.contended_fair = Some(contend_molt(t, a, true).await?);
        }
    }
    if a.locks > 0 && a.runs(Section::Renewal) {
        eprintln!(
            "moltlock-bench: {}: renewal with {} locks",
            t.label(),
            a.locks
        );
        let res = crate::renewal::renewal(t, floor, a.locks, a.renew_ttl, a.tasks).await?;
        r.renewal = Some(res);
    }
    primitives(t, a, r).await
}

/// The floor and MoltLock, one task and many, on distinct keys.
async fn throughput(
    t: &Target,
    a: &Args,
    r: &mut BackendReport,
    backend: Arc<dyn Backend>,
    floor: &Floor,
) -> Result<(), String> {
    let b = bounds(a);
    let floor_c: Arc<dyn Cycler> = Arc::new(floor.clone());
    let molt: Arc<dyn Locker> = Arc::new(MoltLocker::new(backend.clone(), false)?);
    let molt_c: Arc<dyn Cycler> = Arc::new(LockerCycler(molt));
    let one = (
        (floor_c.clone(), keys(t, "floor-u")),
        (molt_c.clone(), keys(t, "lock-u")),
    );
    (r.floor, r.uncontended) = paired(one.0, one.1, 1, b, a.rounds).await?;
    r.uncontended_ratio = ratio(r.uncontended.per_sec, r.floor.per_sec);
    let many = (
        (floor_c.clone(), keys(t, "floor-p")),
        (molt_c, keys(t, "lock-p")),
    );
    (r.floor_parallel, r.parallel) = paired(many.0, many.1, a.tasks, b, a.rounds).await?;
    r.parallel_ratio = ratio(r.parallel.per_sec, r.floor_parallel.per_sec);
    if backend.fair_queue().is_some() {
        // A free key with an empty queue, in the fair mode.
        let fair: Arc<dyn Locker> = Arc::new(MoltLocker::new(backend, true)?);
        let fair_c: Arc<dyn Cycler> = Arc::new(LockerCycler(fair));
        let one = ((floor_c, keys(t, "floor-f")), (fair_c, keys(t, "lock-f")));
        r.fair_uncontended = Some(paired(one.0, one.1, 1, b, a.rounds).await?);
    }
    Ok(())
}

/// The semaphore and multi-lock sections.
async fn primitives(t: &Target, a: &Args, r: &mut BackendReport) -> Result<(), String> {
    if a.runs(Section::Semaphore) {
        eprintln!("moltlock-bench: {}: semaphore", t.label());
        let res = crate::semaphore::semaphore(t, a.permits, a.contenders, bounds(a)).await?;
        r.semaphore = Some(res);
    }
    if a.runs(Section::LockAll) {
        eprintln!("moltlock-bench: {}: lock_all", t.label());
        r.lock_all = Some(crate::lockall::lock_all(t, a.multi_keys, bounds(a)).await?);
    }
    Ok(())
}

/// One manager (own connection) per contender, as separate processes would.
/// Store requests are counted in the default mode (the fair queue's own
/// requests go past the counter).
async fn contend_molt(
    t: &Target,
    a: &Args,
    fair: bool,
) -> Result<crate::workload::ContendedResult, String> {
    let mut lockers: Vec<Arc<dyn Locker>> = Vec::new();
    let (first, reader) = Counting::new(t.backend().await?);
    lockers.push(Arc::new(MoltLocker::new(Arc::new(first), fair)?));
    for _ in 1..a.contenders.max(1) {
        let backend = Counting::sharing(t.backend().await?, &reader);
        lockers.push(Arc::new(MoltLocker::new(Arc::new(backend), fair)?));
    }
    let mode = if fair { "fair" } else { "default" };
    let mut res = contended(&lockers, &t.key("contended", mode), contention(a)).await?;
    if !fair {
        per_acquisition(&mut res, &reader);
    }
    Ok(res)
}

/// One manager shared by every contender, as the tasks of one service use
/// it: its queue of waiters puts one contender on the store.
async fn contend_shared(t: &Target, a: &Args) -> Result<crate::workload::ContendedResult, String> {
    let (backend, reader) = Counting::new(t.backend().await?);
    let shared: Arc<dyn Locker> = Arc::new(MoltLocker::new(Arc::new(backend), false)?);
    let lockers = vec![shared; a.contenders.max(1)];
    let mut res = contended(&lockers, &t.key("contended", "shared"), contention(a)).await?;
    per_acquisition(&mut res, &reader);
    Ok(res)
}

/// Fills in the requests and waits per acquisition from the counts.
fn per_acquisition(res: &mut crate::workload::ContendedResult, reader: &CountReader) {
    let counts = reader.get();
    let n = res.acquisitions as f64;
    res.requests_per_acquisition = Some(ratio(counts.requests() as f64, n));
    res.waits_per_acquisition = Some(ratio(counts.waits as f64, n));
}

async fn run_peer(t: &Target, a: &Args) -> Option<PeerReport> {
    let name = match t.store {
        Store::Redis => "rslock (Redlock, 1 Redis)",
        Store::Etcd => "etcd Lock RPC",
        _ => return None,
    };
    eprintln!("moltlock-bench: measuring {name}");
    let mut p = PeerReport {
        name: name.to_owned(),
        store: t.label().to_owned(),
        ..PeerReport::default()
    };
    if let Err(e) = measure_peer(t, a, &mut p).await {
        eprintln!("moltlock-bench: {name}: {e}");
        p.error = Some(e);
    }
    p.uncontended_ratio = ratio(p.uncontended.per_sec, p.floor.per_sec);
    Some(p)
}

async fn peer_locker(t: &Target) -> Result<Arc<dyn Locker>, String> {
    match t.store {
        Store::Redis => Ok(Arc::new(Rslock::new(&t.plain_url())?)),
        _ => Ok(Arc::new(
            EtcdLockRpc::connect(&t.etcd_endpoints(), &etcd_prefix(&t.run)).await?,
        )),
    }
}

/// The peer's single task against the floor, cycle by cycle as
/// MoltLock's, then its contended run.
async fn measure_peer(t: &Target, a: &Args, p: &mut PeerReport) -> Result<(), String> {
    let floor = Floor::connect(t).await?;
    let one = peer_locker(t).await?;
    let floor_c: Arc<dyn Cycler> = Arc::new(floor.clone());
    let peer_c: Arc<dyn Cycler> = Arc::new(LockerCycler(one.clone()));
    let loops = ((floor_c, keys(t, "floor-r")), (peer_c, keys(t, "peer-u")));
    let res = paired(loops.0, loops.1, 1, bounds(a), a.rounds).await;
    one.close().await;
    (p.floor, p.uncontended) = res?;
    let mut lockers = Vec::new();
    for _ in 0..a.contenders.max(1) {
        lockers.push(peer_locker(t).await?);
    }
    let res = contended(&lockers, &t.key("peer-contended", "default"), contention(a)).await;
    for l in &lockers {
        l.close().await;
    }
    p.contended = Some(res?);
    // The floor's and the Lock RPC's keys live under the run's prefix.
    floor.cleanup().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_plain() {
        assert_eq!(parse_run_id("smoke-42"), Ok("smoke-42".to_owned()));
        for bad in ["", "a_b", "a%", "a/b", &"x".repeat(65)] {
            assert!(parse_run_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("3 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
