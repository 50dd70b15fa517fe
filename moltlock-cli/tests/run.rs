//! `moltlock run` end to end: real processes, real stores.
#![allow(clippy::unwrap_used)] // helpers shared by the tests below unwrap like the tests do

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use moltlock_conformance::fixtures;

const BIN: &str = env!("CARGO_BIN_EXE_moltlock");

fn moltlock(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env("MOLTLOCK_URL", url).env("NO_COLOR", "1");
    c
}

/// A shell command that logs `s <ns>` and `e <ns>` around a short sleep.
fn section(log: &Path) -> Vec<String> {
    let l = log.display();
    vec![
        "sh".into(),
        "-c".into(),
        format!("echo s $(date +%s%N) >> {l}; sleep 0.3; echo e $(date +%s%N) >> {l}"),
    ]
}

fn key() -> String {
    format!("cli/{}", moltlock::Token::random())
}

/// Three processes on one key: the logged sections alternate start, end.
fn serializes(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let k = key();
    let children: Vec<_> = (0..3)
        .map(|_| {
            moltlock(url)
                .args(["run", "--key", &k, "--ttl", "5s", "--"])
                .args(section(&log))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let kinds: Vec<&str> = text.lines().map(|l| &l[..1]).collect();
    assert_eq!(
        kinds,
        ["s", "e", "s", "e", "s", "e"],
        "sections overlapped:\n{text}"
    );
}

/// `--no-wait` on a held key returns 75 at once; the holder's status is its command's.
fn no_wait_is_busy(url: &str) {
    let k = key();
    let mut holder = moltlock(url)
        .args(["run", "--key", &k, "--", "sh", "-c", "sleep 2; exit 3"])
        .spawn()
        .unwrap();
    wait_held(url, &k);
    let started = Instant::now();
    let out = moltlock(url)
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "--no-wait waited"
    );
    assert_eq!(
        holder.wait().unwrap().code(),
        Some(3),
        "the command's own status"
    );
}

/// Waits until a `run` holds `k`, by trying it with --no-wait.
fn wait_held(url: &str, k: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let out = moltlock(url)
            .args(["run", "--key", k, "--no-wait", "--", "true"])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        if out.status.code() == Some(75) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{k} never became held");
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

#[test]
fn sqlite_runs_serialize() {
    let dir = tempfile::tempdir().unwrap();
    serializes(&sqlite_url(dir.path()));
}

#[test]
fn sqlite_no_wait_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    no_wait_is_busy(&sqlite_url(dir.path()));
}

#[test]
fn timeout_gives_124() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let mut holder = moltlock(&url)
        .args(["run", "--key", &k, "--", "sleep", "3"])
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    let out = moltlock(&url)
        .args(["run", "--key", &k, "--timeout", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert!(holder.wait().unwrap().success());
}

#[test]
fn fence_reaches_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let run = |url: &str| -> u64 {
        let out: Output = moltlock(url)
            .args(["run", "--key", &k, "--", "sh", "-c", "echo $MOLTLOCK_FENCE"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let (a, b) = (run(&url), run(&url));
    assert!(b > a, "fences {a} then {b}");
}

#[test]
fn missing_command_is_127() {
    let dir = tempfile::tempdir().unwrap();
    let out = moltlock(&sqlite_url(dir.path()))
        .args(["run", "--key", "x", "--", "/no/such/command"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

/// A holder killed with SIGKILL stops renewing: a waiter gets in after the TTL.
#[test]
fn killed_holder_lets_waiter_in_after_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let pidfile = dir.path().join("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = moltlock(&url)
        .args(["run", "--key", &k, "--ttl", "2s", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    holder.kill().unwrap();
    holder.wait().unwrap();
    let killed_at = Instant::now();
    if let Ok(pid) = std::fs::read_to_string(&pidfile) {
        let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    }
    let out = moltlock(&url)
        .args(["run", "--key", &k, "--timeout", "10s", "--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waited = killed_at.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "the waiter took {waited:?}"
    );
}

/// Deleting the key behind a running holder: the command gets SIGTERM and
/// `run` exits 125 with a message saying why.
#[test]
fn lost_lock_stops_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let holder = moltlock(&url)
        .args([
            "run", "--key", &k, "--ttl", "1s", "--grace", "1s", "--", "sleep", "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let backend = moltlock::connect(&url).await.unwrap();
        let lk: moltlock::LockKey = k.parse().unwrap();
        let info = backend.inspect(&lk).await.unwrap().expect("no holder");
        assert!(backend.delete(&lk, &info.holder).await.unwrap());
    });
    let started = Instant::now();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost the lock"), "{stderr}");
}

#[test]
fn status_lists_holders_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let mut holder = moltlock(&url)
        .args(["run", "--key", &k, "--", "sleep", "2"])
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    let out = moltlock(&url)
        .args(["status", "--prefix", "cli/", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        rows.iter()
            .any(|r| r["key"] == k.as_str() && r["fence"].as_u64().is_some()),
        "{rows:?}"
    );
    let table = moltlock(&url).args(["status"]).output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains(&k));
    holder.wait().unwrap();
}

#[test]
fn conformance_subcommand_prints_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let out = moltlock(&sqlite_url(dir.path()))
        .args(["conformance", "--only", "fences_increase"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("fences_increase_across_release  PASS"),
        "{text}"
    );
    assert!(text.contains("3 passed, 0 failed"), "{text}");
}

#[test]
fn postgres_runs() {
    let url = fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    serializes(&url);
    no_wait_is_busy(&url);
}

#[test]
fn redis_runs() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    serializes(&redis.url());
    no_wait_is_busy(&redis.url());
}

#[test]
fn etcd_runs() {
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    serializes(&etcd.url());
    no_wait_is_busy(&etcd.url());
}
