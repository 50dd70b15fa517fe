//! `moltlock elect` and `moltlock leader` end to end: real processes on a
//! real store. One leader runs its command at a time; a SIGKILLed leader's
//! command dies with it and a successor takes over without overlap;
//! `--keep` campaigns again; `leader` shows the value and term.
#![allow(clippy::unwrap_used)] // tests unwrap

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{sqlite_url, steal};

const BIN: &str = env!("CARGO_BIN_EXE_moltlock");

fn moltlock(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env("MOLTLOCK_URL", url).env("NO_COLOR", "1");
    c
}

fn key() -> String {
    format!("cli-elect/{}", moltlock::Token::random())
}

/// A command that logs `s <name> <ns>` when it starts and `e …` when it
/// ends, around a sleep.
fn logged(log: &Path, name: &str, secs: &str) -> Vec<String> {
    let l = log.display();
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo s {name} $(date +%s%N) >> {l}; sleep {secs}; echo e {name} $(date +%s%N) >> {l}"
        ),
    ]
}

fn candidate(url: &str, k: &str, name: &str, cmd: &[String], extra: &[&str]) -> Child {
    moltlock(url)
        .args([
            "elect", "--key", k, "--value", name, "--ttl", "1s", "--grace", "300ms",
        ])
        .args(extra)
        .arg("--")
        .args(cmd)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The leader's value per `moltlock leader --json`, waiting for one. A
/// new leader's value is stored right after its grant: a reader between
/// the two sees a leader without a value, and waits on.
fn leader_value(url: &str, k: &str) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let out = moltlock(url)
            .args(["leader", "--key", k, "--json"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        if let Some(value) = v["leader"].as_str().filter(|v| !v.is_empty()) {
            assert!(v["term"].as_u64().is_some(), "no term: {text}");
            return value.to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nobody led {k}");
}

/// Start and end lines of the log never interleave: `s a, e a, s b, e b`.
fn never_overlapping(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: Option<String> = None;
    let mut order = Vec::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (kind, name) = (parts.next().unwrap(), parts.next().unwrap().to_string());
        match kind {
            "s" => {
                assert!(open.is_none(), "two leaders ran at once:\n{text}");
                order.push(name.clone());
                open = Some(name);
            }
            _ => {
                assert_eq!(
                    open.as_ref(),
                    Some(&name),
                    "an end without its start:\n{text}"
                );
                open = None;
            }
        }
    }
    order
}

#[test]
fn one_leader_at_a_time_and_leader_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (k, log) = (key(), dir.path().join("log"));
    let mut a = candidate(&url, &k, "a", &logged(&log, "a", "0.8"), &[]);
    let first = leader_value(&url, &k);
    let mut b = candidate(&url, &k, "b", &logged(&log, "b", "0.8"), &[]);
    assert!(first == "a", "the first leader is {first}");
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    assert_eq!(never_overlapping(&log), ["a", "b"]);
    let none = moltlock(&url)
        .args(["leader", "--key", &k])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(75), "{none:?}");
    assert!(String::from_utf8_lossy(&none.stdout).contains("no leader"));
}

#[test]
fn a_sigkilled_leader_is_succeeded_without_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (k, log) = (key(), dir.path().join("log"));
    let mut a = candidate(&url, &k, "a", &logged(&log, "a", "30"), &[]);
    assert_eq!(leader_value(&url, &k), "a");
    let mut b = candidate(&url, &k, "b", &logged(&log, "b", "0.3"), &[]);
    std::thread::sleep(Duration::from_millis(300));
    a.kill().unwrap();
    a.wait().unwrap();
    let took = Instant::now();
    assert!(b.wait().unwrap().success());
    assert!(took.elapsed() < Duration::from_secs(10));
    // a's command was killed with its wrapper: it never logged its end.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("e a"),
        "the killed leader's command ran on:\n{text}"
    );
    let starts: Vec<&str> = text.lines().filter(|l| l.starts_with("s ")).collect();
    assert_eq!(starts.len(), 2, "{text}");
    assert!(starts[1].starts_with("s b"), "{text}");
}

#[test]
fn keep_campaigns_again_after_the_command_ends() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (k, log) = (key(), dir.path().join("log"));
    let mut a = candidate(&url, &k, "a", &logged(&log, "a", "0.2"), &["--keep"]);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let runs = std::fs::read_to_string(&log).unwrap_or_default();
        if runs.lines().filter(|l| l.starts_with("e a")).count() >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = rustix::process::Pid::from_raw(i32::try_from(a.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = a.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
    let runs = never_overlapping(&log);
    assert!(runs.len() >= 3, "ran {} times", runs.len());
}

/// A signal to `elect --keep` ends it with 128 + the signal, also when the
/// command ends at once, so that much of the time is spent between runs
/// (where one handler now serves every run, so no signal falls between
/// two of them).
#[test]
fn keep_ends_on_a_signal_between_runs() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let log = dir.path().join("log");
    for round in 0..3 {
        let k = key();
        let mut a = candidate(&url, &k, "a", &logged(&log, "a", "0"), &["--keep"]);
        std::thread::sleep(Duration::from_millis(400 + 150 * round));
        let pid = rustix::process::Pid::from_raw(i32::try_from(a.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = a.wait().unwrap();
        assert_eq!(status.code(), Some(143), "round {round}: {status:?}");
    }
}

/// A signal ends `elect --keep` with 128 + the signal even when the
/// command it is passed to exits 0 on it (as a command that traps SIGTERM
/// to shut down cleanly does, or one that was ending anyway).
#[test]
fn keep_ends_with_the_signal_when_the_command_exits_0_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let started = dir.path().join("started");
    let script = format!(
        "trap 'exit 0' TERM; touch {}; sleep 30 & wait",
        started.display()
    );
    let cmd = ["sh".to_string(), "-c".to_string(), script];
    let mut a = candidate(&url, &key(), "a", &cmd, &["--keep"]);
    let until = Instant::now() + Duration::from_secs(10);
    while !started.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(started.exists(), "the command never started");
    let pid = rustix::process::Pid::from_raw(i32::try_from(a.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = a.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
}

/// A leader whose leadership is taken away (deleted behind it) stops its
/// command and exits 125.
#[test]
fn a_deposed_leader_stops_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (k, log) = (key(), dir.path().join("log"));
    let mut a = candidate(&url, &k, "a", &logged(&log, "a", "30"), &[]);
    assert_eq!(leader_value(&url, &k), "a");
    steal(&url, &k);
    let started = Instant::now();
    let status = a.wait().unwrap();
    assert_eq!(status.code(), Some(125), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
