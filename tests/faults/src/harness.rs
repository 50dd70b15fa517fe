//! Worker processes, the scenarios, and the report table.
//!
//! Scenario functions are synchronous and meant to be called from a test's
//! own thread: servers the test starts (and restarts inside a scenario's
//! fault closure) then live as long as that thread, which is what the
//! fixtures' parent-death signal needs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use moltlock_fixtures::signal;

use crate::check::{check, Verdict};
use crate::now_ns;
use crate::proxy::{Mode, Proxy};
use crate::service::{Event, Log, Service};

/// Allowance for one hand-off on a busy two-core machine: waking a waiter,
/// its acquire round trip, process scheduling.
pub const HANDOFF: Duration = Duration::from_millis(2500);

/// A store the workers contend on.
#[derive(Clone, Debug)]
pub struct Target {
    /// The backend's name in the report (`redis`, `postgres`, …).
    pub backend: &'static str,
    /// The URL workers connect to directly.
    pub url: String,
    /// The TTL workers lock with.
    pub ttl: Duration,
}

/// What one worker process is asked to do.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Its name in the log.
    pub id: String,
    /// The store URL (possibly through a proxy).
    pub url: String,
    /// The key.
    pub key: String,
    /// The TTL.
    pub ttl: Duration,
    /// How many sections.
    pub rounds: u32,
    /// How long each section lasts between its two writes.
    pub hold: Duration,
    /// Stop itself (SIGSTOP) in this round, after its first write.
    pub pause_round: Option<u32>,
    /// Ignore the validity deadline (a deliberately unsafe worker).
    pub unsafe_mode: bool,
    /// Poll the key this often while waiting (default: the manager's
    /// exponential backoff).
    pub retry: Option<Duration>,
}

impl Spec {
    /// A worker with `rounds` sections of `hold` each.
    pub fn new(id: &str, target: &Target, key: &str, rounds: u32, hold: Duration) -> Self {
        Self {
            id: id.to_owned(),
            url: target.url.clone(),
            key: key.to_owned(),
            ttl: target.ttl,
            rounds,
            hold,
            pause_round: None,
            unsafe_mode: false,
            retry: None,
        }
    }
}

/// A running worker process.
pub struct Worker {
    /// Its name in the log.
    pub id: String,
    child: Child,
    stderr: PathBuf,
}

impl Worker {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it with SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stderr_tail(&self) -> String {
        let text = fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = signal(self.child.id(), "CONT");
        self.kill();
    }
}

/// The test process's side: a runtime for the checker's service and the
/// proxies, and the worker binary.
pub struct Harness {
    rt: tokio::runtime::Runtime,
    /// The checker's service.
    pub service: Service,
    bin: PathBuf,
    dir: tempfile::TempDir,
    proxies: Mutex<Vec<Proxy>>,
    worker_env: Vec<(String, String)>,
}

impl Harness {
    /// Starts the service (with `ignore_fences`, a broken resource that
    /// accepts every write) for workers run from `bin`.
    ///
    /// # Errors
    /// When the runtime or the service cannot start.
    pub fn new(bin: &str, ignore_fences: bool) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let service = rt.block_on(Service::start(ignore_fences))?;
        let dir = tempfile::Builder::new()
            .prefix("moltlock-faults-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        Ok(Self {
            rt,
            service,
            bin: PathBuf::from(bin),
            dir,
            proxies: Mutex::new(Vec::new()),
            worker_env: Vec::new(),
        })
    }

    /// A scratch directory that lives as long as the harness.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts a proxy to `upstream` (`host:port`); returns its index and port.
    ///
    /// # Errors
    /// When it cannot bind.
    pub fn proxy(&self, upstream: &str, mode: Mode) -> Result<(usize, u16), String> {
        let p = self.rt.block_on(Proxy::start(upstream.to_owned(), mode))?;
        let port = p.port;
        let mut all = match self.proxies.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        all.push(p);
        Ok((all.len() - 1, port))
    }

    /// Sets the mode of proxy `i`.
    pub fn set_proxy(&self, i: usize, mode: Mode) {
        let all = match self.proxies.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(p) = all.get(i) {
            p.set(mode);
        }
    }

    /// Starts a worker process and adds it to `workers`.
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn_into(&self, spec: &Spec, workers: &mut Vec<Worker>) -> Result<(), String> {
        workers.push(self.spawn(spec)?);
        Ok(())
    }

    /// Starts `count` plain workers `w0`, `w1`, … on `key`, each doing
    /// `rounds` sections of `hold`, and adds them to `workers`.
    ///
    /// # Errors
    /// When one cannot be spawned.
    pub fn spawn_peers(
        &self,
        target: &Target,
        key: &str,
        count: usize,
        rounds: u32,
        hold: Duration,
        workers: &mut Vec<Worker>,
    ) -> Result<(), String> {
        for i in 0..count {
            self.spawn_into(
                &Spec::new(&format!("w{i}"), target, key, rounds, hold),
                workers,
            )?;
        }
        Ok(())
    }

    /// Starts every later worker with these environment variables (e.g.
    /// under a [`FakeClock`](moltlock_fixtures::clock::FakeClock)).
    pub fn with_worker_env(mut self, env: Vec<(String, String)>) -> Self {
        self.worker_env = env;
        self
    }

    /// Starts a worker process.
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn spawn(&self, spec: &Spec) -> Result<Worker, String> {
        let stderr = self.dir.path().join(format!("{}.err", spec.id));
        let err = fs::File::create(&stderr).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.envs(self.worker_env.iter().map(|(k, v)| (k, v)));
        cmd.args(["--url", &spec.url, "--key", &spec.key])
            .args(["--ttl-ms", &spec.ttl.as_millis().to_string()])
            .args(["--rounds", &spec.rounds.to_string()])
            .args(["--hold-ms", &spec.hold.as_millis().to_string()])
            .args(["--service", &self.service.addr, "--id", &spec.id]);
        if let Some(r) = spec.pause_round {
            cmd.args(["--pause-round", &r.to_string()]);
        }
        if spec.unsafe_mode {
            cmd.arg("--unsafe");
        }
        if let Some(r) = spec.retry {
            cmd.args(["--retry-ms", &r.as_millis().to_string()]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bin.display()))?;
        Ok(Worker {
            id: spec.id.clone(),
            child,
            stderr,
        })
    }

    /// Waits up to `within` for an event matching `pred`.
    pub fn wait_event(&self, within: Duration, pred: impl Fn(&Event) -> bool) -> Option<Event> {
        let until = Instant::now() + within;
        loop {
            if let Some(e) = self.service.find_event(&pred) {
                return Some(e);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `within` for `pred` to hold of the log.
    pub fn wait_log(&self, within: Duration, pred: impl Fn(&Log) -> bool) -> bool {
        let until = Instant::now() + within;
        loop {
            if pred(&self.service.log()) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `within` for every worker to exit successfully; kills
    /// the rest.
    ///
    /// # Errors
    /// Names the workers that failed or did not finish, with their stderr.
    pub fn finish(&self, workers: &mut [Worker], within: Duration) -> Result<(), String> {
        let until = Instant::now() + within;
        let mut problems = Vec::new();
        for w in workers.iter_mut() {
            loop {
                match w.child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        problems.push(format!(
                            "{} exited with {status}: {}",
                            w.id,
                            w.stderr_tail()
                        ));
                        break;
                    }
                    Ok(None) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Ok(None) => {
                        problems.push(format!(
                            "{} did not finish in time: {}",
                            w.id,
                            w.stderr_tail()
                        ));
                        w.kill();
                        break;
                    }
                    Err(e) => {
                        problems.push(format!("{}: {e}", w.id));
                        break;
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// A fresh key for one scenario.
pub fn key(scenario: &str) -> String {
    format!("faults/{scenario}/{}", moltlock::Token::random())
}

/// `url` with its `host:port` replaced by `127.0.0.1:port`.
pub fn via(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (userinfo, hostpart) = match rest.split_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let end = hostpart.find(['/', '?']).unwrap_or(hostpart.len());
    format!("{scheme}://{userinfo}127.0.0.1:{port}{}", &hostpart[end..])
}

/// The `host:port` of `url` (the first, when it lists several).
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let end = rest.find(['/', '?', ',']).unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// The result of one scenario against one backend.
#[derive(Debug)]
pub struct Outcome {
    /// The scenario's name.
    pub scenario: String,
    /// The backend's name.
    pub backend: String,
    /// What the checker found.
    pub verdict: Verdict,
    /// Time from the fault to the next acquisition by a healthy worker.
    pub recovery: Option<Duration>,
    /// Problems found outside the checker (a scenario's own assertions).
    pub failures: Vec<String>,
    /// Free text for the report.
    pub note: String,
    /// The whole log, for the evidence file written next to the report.
    pub log: Option<Log>,
    /// A deliberately unsafe run: the report calls it `caught` when the
    /// checker found violations (as it must), `MISSED` when not.
    pub unsafe_demo: bool,
}

impl Outcome {
    fn new(scenario: &str, target: &Target) -> Self {
        Self {
            scenario: scenario.to_owned(),
            backend: target.backend.to_owned(),
            verdict: Verdict::default(),
            recovery: None,
            failures: Vec::new(),
            note: String::new(),
            log: None,
            unsafe_demo: false,
        }
    }

    fn fail(&mut self, what: impl Into<String>) {
        self.failures.push(what.into());
    }

    /// Whether the scenario passed: no violation, no failed expectation.
    pub fn passed(&self) -> bool {
        self.verdict.clean() && self.failures.is_empty()
    }

    /// A readable account of everything that went wrong.
    pub fn explain(&self) -> String {
        let mut out = format!("{} × {}:\n", self.scenario, self.backend);
        for v in &self.verdict.violations {
            out.push_str(&format!("  violation: {v}\n"));
        }
        for f in &self.failures {
            out.push_str(&format!("  failed: {f}\n"));
        }
        out
    }

    /// Writes this outcome's row under `dir` (replacing an earlier run's row
    /// of the same scenario and backend) and renders `dir/report.md` from
    /// every row there.
    pub fn record(&self, dir: &Path) {
        let rows = dir.join("rows");
        let _ = fs::create_dir_all(&rows);
        let recovery = self
            .recovery
            .map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        let result = match (self.unsafe_demo, self.passed()) {
            (false, true) => "pass",
            (false, false) => "FAIL",
            (true, false) if !self.verdict.clean() => "caught (expected)",
            (true, _) => "MISSED",
        };
        let row = [
            self.scenario.clone(),
            self.backend.clone(),
            self.verdict.acquisitions.to_string(),
            self.verdict.violations.len().to_string(),
            recovery,
            result.to_owned(),
            self.note.replace(['\t', '\n'], " "),
        ]
        .join("\t");
        let _ = fs::write(
            rows.join(format!("{}__{}.tsv", self.scenario, self.backend)),
            row,
        );
        if let Some(log) = &self.log {
            let logs = dir.join("logs");
            let _ = fs::create_dir_all(&logs);
            let _ = fs::write(
                logs.join(format!("{}__{}.txt", self.scenario, self.backend)),
                format!("{}\n{log:#?}", self.explain()),
            );
        }
        let _ = fs::write(dir.join("report.md"), render(dir));
    }
}

/// The markdown table of every row recorded under `dir`.
pub fn render(dir: &Path) -> String {
    let mut rows: Vec<String> = fs::read_dir(dir.join("rows"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    rows.sort();
    let mut out = String::from(
        "| scenario | backend | acquisitions | violations | time to recover | result | notes |\n\
         |---|---|---:|---:|---:|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} |\n",
            r.trim().split('\t').collect::<Vec<_>>().join(" | ")
        ));
    }
    out
}

fn ns_to(d: u128) -> Duration {
    Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX))
}

fn acquired_by_other(victim: &str, after: u128) -> impl Fn(&Event) -> bool + '_ {
    move |e: &Event| e.kind == "acquired" && e.worker != victim && e.t > after
}

/// **Holder killed (SIGKILL)**: three workers contend; the first holder is
/// killed inside its section. The next holder must get the key within
/// TTL + one hand-off.
pub fn holder_killed(h: &Harness, target: &Target) -> Outcome {
    let mut out = Outcome::new("holder-sigkill", target);
    let key = key("sigkill");
    let hold = Duration::from_millis(400);
    let mut workers = Vec::new();
    if let Err(e) = h.spawn_peers(target, &key, 3, 4, hold, &mut workers) {
        out.fail(e);
        return out;
    }
    let Some(first) = h.wait_event(Duration::from_secs(30), |e| e.kind == "acquired") else {
        out.fail("nobody acquired the key within 30 s");
        return out;
    };
    let killed_at = now_ns();
    if let Some(w) = workers.iter_mut().find(|w| w.id == first.worker) {
        w.kill();
    }
    let bound = target.ttl + HANDOFF;
    match h.wait_event(
        bound + Duration::from_secs(5),
        acquired_by_other(&first.worker, killed_at),
    ) {
        Some(next) => {
            let took = ns_to(next.t.saturating_sub(killed_at));
            out.recovery = Some(took);
            if took > bound {
                out.fail(format!(
                    "the next holder took {took:?} (> TTL + hand-off = {bound:?})"
                ));
            }
        }
        None => out.fail(format!(
            "nobody took the key after the holder was killed, within {bound:?} + 5 s"
        )),
    }
    workers.retain(|w| w.id != first.worker);
    if let Err(e) = h.finish(&mut workers, Duration::from_secs(60)) {
        out.fail(e);
    }
    let log = h.service.log();
    out.verdict = check(&log);
    out.log = Some(log);
    out.note = format!("killed {} holding fence {}", first.worker, first.fence);
    out
}

/// **Holder paused (SIGSTOP) past its TTL**: the first holder stops itself
/// after its first write; another worker takes the key and writes; then the
/// paused one is resumed (SIGCONT) and writes again. Its `lost()` must
/// fire, its late write must be refused, and no valid sections overlap.
///
/// With `unsafe_holder` the paused worker ignores its deadline and reports
/// its section as valid — the checker must then find an overlap.
pub fn holder_paused(h: &Harness, target: &Target, unsafe_holder: bool) -> Outcome {
    let name = if unsafe_holder {
        "unsafe-holder-sigstop"
    } else {
        "holder-sigstop"
    };
    let mut out = Outcome::new(name, target);
    let key = key("sigstop");
    let mut victim = Spec::new("paused", target, &key, 1, Duration::from_millis(100));
    victim.pause_round = Some(0);
    victim.unsafe_mode = unsafe_holder;
    let mut workers = Vec::new();
    if let Err(e) = h.spawn_into(&victim, &mut workers) {
        out.fail(e);
        return out;
    }
    let Some(paused) = h.wait_event(Duration::from_secs(30), |e| e.kind == "pausing") else {
        out.fail("the victim never reached its pause point");
        return out;
    };
    if let Err(e) = h.spawn_peers(target, &key, 2, 3, Duration::from_millis(300), &mut workers) {
        out.fail(e);
        return out;
    }
    let bound = target.ttl + HANDOFF;
    match h.wait_event(
        bound + Duration::from_secs(5),
        acquired_by_other("paused", paused.t),
    ) {
        Some(next) => {
            let took = ns_to(next.t.saturating_sub(paused.t));
            out.recovery = Some(took);
            if took > bound {
                out.fail(format!(
                    "the next holder took {took:?} (> TTL + hand-off = {bound:?})"
                ));
            }
            if took < target.ttl.mul_f64(0.9) {
                out.fail(format!(
                    "the key was handed over {took:?} after the pause, before the TTL"
                ));
            }
        }
        None => out.fail("nobody took the key while the holder was paused"),
    }
    let fence = paused.fence;
    if !h.wait_log(Duration::from_secs(10), |l| {
        l.writes.iter().any(|w| w.accepted && w.fence > fence)
    }) {
        out.fail("no newer holder wrote while the victim was paused");
    }
    let pid = paused.note.trim().parse::<u32>().unwrap_or(0);
    if let Err(e) = signal(pid, "CONT") {
        out.fail(e);
    }
    if let Err(e) = h.finish(&mut workers, Duration::from_secs(60)) {
        out.fail(e);
    }
    let log = h.service.log();
    out.verdict = check(&log);
    out.log = Some(log.clone());
    if !unsafe_holder {
        match log.sections.iter().find(|s| s.worker == "paused") {
            Some(s) if s.report.second_write => {
                out.fail("the paused holder's late write was accepted")
            }
            Some(s) if s.report.valid => {
                out.fail("the paused holder reported its section as valid")
            }
            Some(_) => {}
            None => out.fail("the paused holder reported no section"),
        }
        if !log
            .events
            .iter()
            .any(|e| e.worker == "paused" && e.kind == "lost")
        {
            out.fail("lost() never fired for the paused holder");
        }
    }
    let late = log.sections.iter().find(|s| s.worker == "paused");
    let lost = log
        .events
        .iter()
        .any(|e| e.worker == "paused" && e.kind == "lost");
    out.note = format!(
        "paused fence {fence}; late write {}; lost() {}",
        match late {
            Some(s) if s.report.second_write => "ACCEPTED",
            Some(_) => "refused",
            None => "missing",
        },
        if lost {
            "fired on resume"
        } else {
            "did not fire"
        }
    );
    if unsafe_holder {
        out.note.push_str("; holder ignores its deadline");
    }
    out
}

/// **Connection cut**: the first holder reaches the store through a proxy
/// that then `mode`s (drops or stalls) its traffic. Its `lost()` must fire
/// before the store hands the key to another worker, and its late write
/// must be refused.
pub fn connection_cut(h: &Harness, target: &Target, mode: Mode) -> Outcome {
    let name = match mode {
        Mode::Drop => "cut-drop",
        _ => "cut-stall",
    };
    let mut out = Outcome::new(name, target);
    let key = key(name);
    let (proxy, port) = match h.proxy(&host_port(&target.url), Mode::Pass) {
        Ok(p) => p,
        Err(e) => {
            out.fail(e);
            return out;
        }
    };
    let mut victim = Spec::new("cut", target, &key, 1, target.ttl * 4);
    victim.url = via(&target.url, port);
    let mut workers = Vec::new();
    if let Err(e) = h.spawn_into(&victim, &mut workers) {
        out.fail(e);
        return out;
    }
    let Some(held) = h.wait_event(Duration::from_secs(30), |e| e.kind == "acquired") else {
        out.fail("the victim never acquired");
        return out;
    };
    if let Err(e) = h.spawn_peers(target, &key, 2, 2, Duration::from_millis(200), &mut workers) {
        out.fail(e);
        return out;
    }
    std::thread::sleep(target.ttl / 2);
    let cut_at = now_ns();
    h.set_proxy(proxy, mode);
    let bound = target.ttl + HANDOFF;
    let lost = h.wait_event(bound, |e| e.worker == "cut" && e.kind == "lost");
    let next = h.wait_event(
        bound + Duration::from_secs(5),
        acquired_by_other("cut", cut_at),
    );
    match (&lost, &next) {
        (Some(l), Some(n)) => {
            out.recovery = Some(ns_to(n.t.saturating_sub(cut_at)));
            if l.t >= n.t {
                out.fail(format!(
                    "lost() fired {} µs after the next holder acquired",
                    (l.t - n.t) / 1000
                ));
            }
            out.note = format!(
                "lost() {} ms after the cut, {} ms before the next acquire",
                l.t.saturating_sub(cut_at) / 1_000_000,
                n.t.saturating_sub(l.t) / 1_000_000
            );
        }
        (None, _) => out.fail("lost() never fired for the cut-off holder"),
        (_, None) => out.fail("nobody took the key after the holder was cut off"),
    }
    // Let the victim's late write and release through once the key moved on.
    if !h.wait_log(Duration::from_secs(10), |l| {
        l.writes.iter().any(|w| w.accepted && w.fence > held.fence)
    }) {
        out.fail("no newer holder wrote after the cut");
    }
    h.set_proxy(proxy, Mode::Pass);
    if let Err(e) = h.finish(&mut workers, Duration::from_secs(60)) {
        out.fail(e);
    }
    let log = h.service.log();
    out.verdict = check(&log);
    out.log = Some(log.clone());
    match log.sections.iter().find(|s| s.worker == "cut") {
        Some(s) if s.report.second_write => {
            out.fail("the cut-off holder's late write was accepted")
        }
        Some(s) if s.report.valid => out.fail("the cut-off holder reported its section as valid"),
        Some(_) => {}
        None => out.fail("the cut-off holder reported no section"),
    }
    out
}

/// **Slow store**: every worker reaches the store through a proxy adding
/// `delay` each way. Sections last longer than the TTL, so holds live on
/// renewals alone: no `lost()` may fire, and every section stays valid.
pub fn slow_store(h: &Harness, target: &Target, delay: Duration) -> Outcome {
    let mut out = Outcome::new("slow-store", target);
    let key = key("slow");
    let (_, port) = match h.proxy(&host_port(&target.url), Mode::Delay(delay)) {
        Ok(p) => p,
        Err(e) => {
            out.fail(e);
            return out;
        }
    };
    let hold = target.ttl.mul_f64(1.2);
    let mut workers = Vec::new();
    for i in 0..3 {
        let mut spec = Spec::new(&format!("w{i}"), target, &key, 2, hold);
        spec.url = via(&target.url, port);
        if let Err(e) = h.spawn_into(&spec, &mut workers) {
            out.fail(e);
            return out;
        }
    }
    if let Err(e) = h.finish(&mut workers, Duration::from_secs(90)) {
        out.fail(e);
    }
    let log = h.service.log();
    out.verdict = check(&log);
    out.log = Some(log.clone());
    let lost: Vec<_> = log.events.iter().filter(|e| e.kind == "lost").collect();
    if !lost.is_empty() {
        out.fail(format!("lost() fired under {delay:?} of latency: {lost:?}"));
    }
    if out.verdict.valid_sections != 6 || out.verdict.sections != 6 {
        out.fail(format!(
            "{} of {} sections valid (expected 6 of 6)",
            out.verdict.valid_sections, out.verdict.sections
        ));
    }
    out.note = format!("{} ms each way, holds of 1.2 × TTL", delay.as_millis());
    out
}

/// **Store fault during contention** (a restart, a leader kill): three
/// workers contend with sections of 0.4 × TTL, waiters polling every 25 ms;
/// once some sections are done, `fault` runs on the calling thread right
/// after a holder entered its section, and a fourth worker with a fresh
/// connection joins after it (as a node starting after the fault would).
/// No two holders may believe they hold at once, the workers must carry on,
/// and every fence acquired after the fault must exceed every fence
/// acquired before it.
pub fn store_fault(
    h: &Harness,
    scenario: &str,
    target: &Target,
    fault: impl FnOnce() -> Result<(), String>,
) -> Outcome {
    let mut out = Outcome::new(scenario, target);
    let key = key(scenario);
    let mut workers = Vec::new();
    for i in 0..3 {
        let mut spec = Spec::new(&format!("w{i}"), target, &key, 3, target.ttl.mul_f64(0.4));
        spec.retry = Some(Duration::from_millis(25));
        if let Err(e) = h.spawn_into(&spec, &mut workers) {
            out.fail(e);
            return out;
        }
    }
    if !h.wait_log(Duration::from_secs(30), |l| l.sections.len() >= 2) {
        out.fail("no progress before the fault");
        return out;
    }
    // Strike right after a holder entered its section, so the fault lands
    // while the key is held.
    let mark = now_ns();
    if h.wait_event(Duration::from_secs(10), |e| {
        e.kind == "acquired" && e.t > mark
    })
    .is_none()
    {
        out.fail("no acquisition to strike after");
        return out;
    }
    let before = now_ns();
    if let Err(e) = fault() {
        out.fail(format!("the fault itself failed: {e}"));
        return out;
    }
    let after = now_ns();
    // A newcomer with a fresh connection, as a node starting after the
    // fault would be: it takes the key as soon as the store lets it.
    let mut late = Spec::new("late", target, &key, 1, target.ttl.mul_f64(0.4));
    late.retry = Some(Duration::from_millis(25));
    match h.spawn(&late) {
        Ok(w) => workers.push(w),
        Err(e) => out.fail(e),
    }
    match h.wait_event(Duration::from_secs(60), |e| {
        e.kind == "acquired" && e.t > after
    }) {
        Some(e) => out.recovery = Some(ns_to(e.t.saturating_sub(before))),
        None => out.fail("nobody acquired after the fault"),
    }
    if let Err(e) = h.finish(&mut workers, Duration::from_secs(90)) {
        out.fail(e);
    }
    let log = h.service.log();
    out.verdict = check(&log);
    out.log = Some(log.clone());
    let acquired = log.events.iter().filter(|e| e.kind == "acquired");
    let max_before = acquired
        .clone()
        .filter(|e| e.t < before)
        .map(|e| e.fence)
        .max();
    let min_after = acquired.filter(|e| e.t > after).map(|e| e.fence).min();
    match (max_before, min_after) {
        (Some(b), Some(a)) if a <= b => out.fail(format!(
            "fence went backwards across the fault: {a} after, {b} before"
        )),
        (Some(b), Some(a)) => out.note = format!("fences {b} before, {a} after"),
        _ => out.fail("no acquisitions on both sides of the fault"),
    }
    out
}
