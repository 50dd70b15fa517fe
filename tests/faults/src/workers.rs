//! Worker processes: what they run against, how they are started, and
//! the harness that runs one scenario's workers.
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

    pub(crate) fn stderr_tail(&self) -> String {
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
    elect: bool,
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
            elect: false,
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

    /// Makes every later worker a candidate of an election on its key: a
    /// section is then one term of leadership, its fence the term.
    pub fn electing(mut self) -> Self {
        self.elect = true;
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
        if self.elect {
            cmd.arg("--elect");
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
