//! `moltlock run` end to end: real processes, real stores.
#![allow(clippy::unwrap_used)] // helpers shared by the tests below unwrap like the tests do

use moltlock::BackendExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use moltlock_fixtures as fixtures;

mod common;
use common::{sqlite_url, steal};

const BIN: &str = env!("CARGO_BIN_EXE_moltlock");

/// `url` with one more query parameter.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

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
    let _forget = fixtures::rows::Forget::new(url, &k);
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
    let _forget = fixtures::rows::Forget::new(url, &k);
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
        if let Ok(pid) = pid.trim().parse::<u32>() {
            let _ = fixtures::signal(pid, "KILL");
        }
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
            "run", "--key", &k, "--ttl", "1s", "--grace", "400ms", "--", "sleep", "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    steal(&url, &k);
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
        text.contains("fences_increase_across_release  ok  "),
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

// ---------------------------------------------------------------------------
// Issue 13: the command never runs outside the lock, secrets never printed,
// statuses and output people rely on. One case (or more) per numbered item.
// ---------------------------------------------------------------------------

/// `moltlock` with a private HOME (so the default store is private) and no
/// store in the environment.
fn moltlock_home(home: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.env("HOME", home)
        .env_remove("XDG_STATE_HOME")
        .env_remove("MOLTLOCK_URL")
        .env("NO_COLOR", "1");
    c
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Pids written one per line to `file`, once there are `n` of them.
fn wait_pids(file: &Path, n: usize) -> Vec<u32> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let pids: Vec<u32> = std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(
            Instant::now() < until,
            "{} never got {n} pids",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls until none of `pids` runs; returns how long that took, or panics
/// after `limit`.
fn gone_within(pids: &[u32], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            return started.elapsed();
        }
        if started.elapsed() > limit {
            for p in &left {
                let _ = fixtures::signal(*p, "KILL");
            }
            panic!("processes {left:?} of the command still ran {limit:?} later");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A shell script that records its own pid and a background `sleep`'s, then
/// waits: a command with a grandchild in its group.
fn two_pids(pidfile: &Path) -> String {
    let f = pidfile.display();
    format!("echo $$ >> {f}; sleep 600 & echo $! >> {f}; wait")
}

fn send(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// The children of `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Item 1: SIGKILL of `moltlock` kills the command's whole group at once
/// (the issue asks for 100 ms; the bound here allows for a loaded machine
/// and the measured time is printed), and the key is then only the TTL's.
#[test]
fn item1_sigkill_of_the_wrapper_kills_the_command_group() {
    let home = tempfile::tempdir().unwrap();
    let pidfile = home.path().join("pids");
    let k = key();
    let mut wrapper = moltlock_home(home.path())
        .args(["run", "--key", &k, "--", "sh", "-c", &two_pids(&pidfile)])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = wait_pids(&pidfile, 2);
    assert!(pids.iter().all(|p| alive(*p)));
    wrapper.kill().unwrap();
    let took = gone_within(&pids, Duration::from_secs(1));
    wrapper.wait().unwrap();
    eprintln!("the command's group was gone {took:?} after SIGKILL of moltlock");
}

/// Item 1: SIGHUP and SIGQUIT stop the command like SIGTERM: its whole
/// group gets SIGTERM, and `moltlock` exits with the command's status.
#[test]
fn item1_sighup_and_sigquit_stop_the_command_group() {
    use rustix::process::Signal;
    for sig in [Signal::HUP, Signal::QUIT, Signal::TERM] {
        let home = tempfile::tempdir().unwrap();
        let pidfile = home.path().join("pids");
        let k = key();
        let mut wrapper = moltlock_home(home.path())
            .args(["run", "--key", &k, "--", "sh", "-c", &two_pids(&pidfile)])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pids = wait_pids(&pidfile, 2);
        send(wrapper.id(), sig);
        gone_within(&pids, Duration::from_secs(5));
        let status = wrapper.wait().unwrap();
        assert_eq!(status.code(), Some(128 + 15), "{sig:?}: {status:?}");
        // Released on the way out: the key is free at once.
        let out = moltlock_home(home.path())
            .args(["run", "--key", &k, "--no-wait", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{sig:?}: the key was not released"
        );
    }
}

/// Wrapper SIGSTOP: the watchdog kills the command at the hold's deadline,
/// before the store can give the key to the next holder, whose command then
/// finds none of the first command's processes.
#[test]
fn item1_sigstop_of_the_wrapper_never_overlaps_the_next_holder() {
    let home = tempfile::tempdir().unwrap();
    let fences = sigstop_never_overlaps(&|| moltlock_home(home.path()), home.path(), "5s", &key());
    assert!(
        fences.len() == 2 && fences[1] > fences[0],
        "fences {fences:?}"
    );
}

/// SIGSTOPs a holder's wrapper, then runs the next holder, whose command
/// checks that none of the first command's processes still runs; returns
/// the two holders' fences. `cmd` makes a `moltlock` command for the store.
fn sigstop_never_overlaps(cmd: &dyn Fn() -> Command, dir: &Path, ttl: &str, k: &str) -> Vec<u64> {
    let pidfile = dir.join("stopped");
    let fences = dir.join("fences");
    let result = dir.join("overlap");
    let script = format!(
        "echo $MOLTLOCK_FENCE >> {}; {}",
        fences.display(),
        two_pids(&pidfile)
    );
    let mut first = cmd()
        .args(["run", "--key", k, "--ttl", ttl, "--", "sh", "-c", &script])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = wait_pids(&pidfile, 2);
    send(first.id(), rustix::process::Signal::STOP);
    let check = format!(
        "echo $MOLTLOCK_FENCE >> {}; for p in {}; do if [ -e /proc/$p ] && \
         ! grep -q '^State:.*[ZX]' /proc/$p/status; then echo running $p; fi; done > {}",
        fences.display(),
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        result.display()
    );
    let second = cmd()
        .args([
            "run",
            "--key",
            k,
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            &check,
        ])
        .output()
        .unwrap();
    send(first.id(), rustix::process::Signal::CONT);
    let first = first.wait().unwrap();
    gone_within(&pids, Duration::from_secs(2));
    assert!(second.status.success(), "{second:?}");
    let overlap = std::fs::read_to_string(&result).unwrap();
    assert!(overlap.is_empty(), "the next holder ran beside: {overlap}");
    assert_eq!(first.code(), Some(125));
    std::fs::read_to_string(&fences)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// Item 2: a lost lock stops the whole group, not only the direct child:
/// the `sleep` of `sh -c 'sleep 600; echo'` dies too.
#[test]
fn item2_lost_lock_stops_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let pidfile = dir.path().join("pid");
    let k = key();
    let script = format!("echo $$ > {}; sleep 600; echo", pidfile.display());
    // No pipes to the wrapper: a process that outlived it would hold them.
    let mut wrapper = moltlock(&url)
        .args(["run", "--key", &k, "--ttl", "1s", "--", "sh", "-c", &script])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sh = wait_pids(&pidfile, 1)[0];
    let until = Instant::now() + Duration::from_secs(10);
    let sleep = loop {
        if let Some(c) = children(sh).first() {
            break *c;
        }
        assert!(Instant::now() < until, "sh never started sleep");
        std::thread::sleep(Duration::from_millis(10));
    };
    steal(&url, &k);
    let status = wrapper.wait().unwrap();
    gone_within(&[sh, sleep], Duration::from_secs(2));
    assert_eq!(status.code(), Some(125));
}

/// Item 3: stopping needs no `kill` program: with a PATH that has only `sh`
/// and `sleep`, the command still gets its SIGTERM.
#[test]
fn item3_signals_need_no_kill_binary() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["sh", "sleep"] {
        let found = ["/bin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap();
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    let url = sqlite_url(dir.path());
    let log = dir.path().join("log");
    let pidfile = dir.path().join("pid");
    let k = key();
    let script = format!(
        "trap 'echo got-term >> {l}; exit 0' TERM; echo $$ > {p}; sleep 600 & wait",
        l = log.display(),
        p = pidfile.display()
    );
    let mut wrapper = moltlock(&url)
        .env("PATH", &bin)
        .args(["run", "--key", &k, "--ttl", "2s", "--", "sh", "-c", &script])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    steal(&url, &k);
    assert_eq!(wrapper.wait().unwrap().code(), Some(125));
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(log.contains("got-term"), "no SIGTERM reached the command");
}

/// `host:port` of a `redis://host:port/…` URL.
fn redis_addr(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let authority = rest.split(['/', '?']).next().unwrap();
    let hostport = authority.rsplit('@').next().unwrap();
    if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    }
}

/// Deletes every key under `prefix` on the Redis at `addr` (one EVAL).
fn redis_clean(addr: &str, prefix: &str) {
    use std::io::{Read, Write};
    let script = "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
                  redis.call('DEL', k) n = n + 1 end return n";
    let pattern = format!("{prefix}*");
    let args = ["EVAL", script, "0", &pattern];
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(cmd.as_bytes()).unwrap();
    let mut reply = [0u8; 64];
    let n = conn.read(&mut reply).unwrap();
    assert!(
        reply[..n].starts_with(b":"),
        "{:?}",
        String::from_utf8_lossy(&reply[..n])
    );
}

/// Item 4: renewals stop reaching the store (a stalled connection) and the
/// command ignores SIGTERM: it is killed at the hold's deadline, before the
/// store lets the next holder in, whose command finds none of its processes.
#[test]
fn item4_a_command_ignoring_sigterm_is_killed_before_the_handover() {
    use moltlock_faults::proxy::{Mode, Proxy};
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let addr = redis_addr(&redis.url());
    let prefix = fixtures::redis::unique_prefix();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt.block_on(Proxy::start(addr.clone(), Mode::Pass)).unwrap();
    // The fixture's own options (a fresh server's restart quarantine off).
    let url = redis.url();
    let own = url
        .split_once('?')
        .map_or(String::new(), |(_, q)| format!("&{q}"));
    let direct = format!("redis://{addr}/?key_prefix={prefix}{own}");
    let proxied = format!("redis://127.0.0.1:{}/?key_prefix={prefix}{own}", proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let result = dir.path().join("overlap");
    let k = key();
    let script = format!("trap '' TERM; {}", two_pids(&pidfile));
    let mut first = moltlock(&proxied)
        .args([
            "run", "--key", &k, "--ttl", "6s", "--grace", "2500ms", "--", "sh", "-c", &script,
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = wait_pids(&pidfile, 2);
    proxy.set(Mode::Stall);
    let check = format!(
        "for p in {}; do if [ -e /proc/$p ] && ! grep -q '^State:.*[ZX]' /proc/$p/status; \
         then echo running $p; fi; done > {}",
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        result.display()
    );
    let second = moltlock(&direct)
        .args([
            "run",
            "--key",
            &k,
            "--timeout",
            "30s",
            "--",
            "sh",
            "-c",
            &check,
        ])
        .output()
        .unwrap();
    proxy.set(Mode::Pass);
    let first = first.wait().unwrap();
    gone_within(&pids, Duration::from_secs(2));
    redis_clean(&addr, &prefix);
    assert!(second.status.success(), "{second:?}");
    let overlap = std::fs::read_to_string(&result).unwrap();
    assert!(overlap.is_empty(), "the next holder ran beside: {overlap}");
    assert_eq!(first.code(), Some(125), "{first:?}");
}

/// Item 4: a --grace that does not fit the TTL is refused with the rule.
#[test]
fn item4_grace_must_fit_the_ttl() {
    let home = tempfile::tempdir().unwrap();
    let out = moltlock_home(home.path())
        .args([
            "run", "--key", "x", "--ttl", "10s", "--grace", "6s", "--", "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--grace") && err.contains("4.8s"), "{err}");
    let help = moltlock_home(home.path())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("deadline minus the grace"), "{help}");
}

/// Item 5: the default store is one per-user file, whatever the working
/// directory: a second run elsewhere finds the key held. Its directory is
/// 0700 and the file 0600; `status` shows it and creates nothing; memory
/// and nameless SQLite stores are refused for `run`.
#[test]
fn item5_default_store_is_per_user_not_per_directory() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let db = home.path().join(".local/state/moltlock/locks.db");

    let status = moltlock_home(home.path()).arg("status").output().unwrap();
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains(&db.display().to_string()));
    assert!(!db.exists(), "status created the store");
    assert!(
        !home.path().join(".local").exists(),
        "status created a directory"
    );

    let pidfile = home.path().join("pid");
    let script = format!("echo $$ > {}; sleep 3", pidfile.display());
    let k = key();
    let mut holder = moltlock_home(home.path())
        .current_dir(a.path())
        .args(["run", "--key", &k, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    let other = moltlock_home(home.path())
        .current_dir(b.path())
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(75), "{other:?}");
    assert!(holder.wait().unwrap().success());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&db), 0o600);
    assert_eq!(mode(db.parent().unwrap()), 0o700);
    let help = moltlock_home(home.path()).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains(&db.display().to_string()));

    for url in [
        "sqlite::memory:",
        "sqlite://:memory:",
        "sqlite://",
        "sqlite:",
    ] {
        let out = moltlock_home(home.path())
            .args(["--url", url, "run", "--key", "x", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{url}: {out:?}");
    }
}

/// One `--timeout` run on a fresh key, then an immediate `--no-wait` run
/// that must get the key: the cut attempt left no hold behind.
fn cut_attempt_leaves_key_free(url: &str, timeout: &str) {
    let k = key();
    let _forget = fixtures::rows::Forget::new(url, &k);
    let first = moltlock(url)
        .args(["run", "--key", &k, "--timeout", timeout, "--", "true"])
        .output()
        .unwrap();
    assert!(
        matches!(first.status.code(), Some(0 | 124)),
        "--timeout {timeout}: {first:?}"
    );
    let next = moltlock(url)
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        next.status.code(),
        Some(0),
        "--timeout {timeout} left the key held: {next:?}"
    );
}

/// Item 6: attempts cut short by --timeout leave no hold behind (30 tries,
/// ten at a time, since the cut lands at a random point of the attempt),
/// and `--timeout 0` is one attempt.
#[test]
fn item6_timed_out_attempts_leave_the_key_free() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    for batch in 0..3 {
        std::thread::scope(|s| {
            for i in 0..10 {
                let timeout = ["0", "1ms", "2ms", "3ms", "5ms"][(batch + i) % 5];
                let url = url.as_str();
                s.spawn(move || cut_attempt_leaves_key_free(url, timeout));
            }
        });
    }
    let out = moltlock(&url)
        .args(["run", "--key", &key(), "--timeout", "0", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "--timeout 0 on a free key: {out:?}");
}

/// Item 6 on a server store.
#[test]
fn item6_timed_out_attempts_leave_the_key_free_on_postgres() {
    let url = fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    std::thread::scope(|s| {
        for timeout in [
            "1ms", "2ms", "5ms", "10ms", "20ms", "1ms", "2ms", "5ms", "10ms", "20ms",
        ] {
            let url = url.as_str();
            s.spawn(move || cut_attempt_leaves_key_free(url, timeout));
        }
    });
}

/// Item 8: no form of a malformed URL, from --url or MOLTLOCK_URL, prints
/// its password.
#[test]
fn item8_passwords_never_printed() {
    let home = tempfile::tempdir().unwrap();
    let pw = "Pw0rdX9q";
    let urls = [
        format!("postgres//app:{pw}@db/x"),
        format!("redis//:{pw}@h"),
        format!("mongodb://h/db?password={pw}"),
        format!("etcd:u:{pw}@h:2379"),
        format!("etcd:/u:{pw}@127.0.0.1:2379"),
        format!("postgres:/u:{pw}@127.0.0.1/x"),
        format!("mysql:/u:{pw}@127.0.0.1/x"),
        format!("postgres://u:{pw}@127.0.0.1:1/x"),
        format!("redis://:{pw}@127.0.0.1:1/?password={pw}"),
    ];
    for url in &urls {
        for via_env in [false, true] {
            for sub in [&["run", "--key", "k", "--", "true"][..], &["status"][..]] {
                let mut c = moltlock_home(home.path());
                if via_env {
                    c.env("MOLTLOCK_URL", url);
                } else {
                    c.args(["--url", url]);
                }
                let out = c.args(sub).output().unwrap();
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(!out.status.success(), "{url} {sub:?} worked");
                assert!(!text.contains(pw), "{url} (env {via_env}) {sub:?}: {text}");
            }
        }
    }
    // A bad value on the command line is echoed by the usage error: redacted.
    let out = moltlock_home(home.path())
        .args([&format!("postgres://u:{pw}@h/x"), "run"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(pw));
}

/// Item 9: MOLTLOCK_URL (credentials and all) is not passed to the command
/// unless --pass-url.
#[test]
fn item9_store_url_is_not_passed_to_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let show = ["sh", "-c", "echo \"url=${MOLTLOCK_URL-unset}\""];
    let out = moltlock(&url)
        .args(["run", "--key", &key(), "--"])
        .args(show)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "url=unset");
    let out = moltlock(&url)
        .args(["run", "--key", &key(), "--pass-url", "--"])
        .args(show)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("url={url}")
    );
}

/// Item 10: usage errors exit 64, never 2 (a command's own status); the
/// status for "not obtained" can be chosen with --conflict-exit-code.
#[test]
fn item10_usage_errors_and_conflict_exit_code() {
    let home = tempfile::tempdir().unwrap();
    let usage: [&[&str]; 5] = [
        &["run", "--bogus"],
        &["run", "--key", "k", "--ttl", "5x", "--", "true"],
        &["run", "--key", "k"],
        &["frobnicate"],
        &[],
    ];
    for args in usage {
        let out = moltlock_home(home.path()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
    }
    let out = moltlock_home(home.path())
        .args(["run", "--key", "k", "--", "sh", "-c", "exit 2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "the command's own 2");

    let pidfile = home.path().join("pid");
    let k = key();
    let script = format!("echo $$ > {}; sleep 3", pidfile.display());
    let mut holder = moltlock_home(home.path())
        .args(["run", "--key", &k, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    for extra in [&["--no-wait"][..], &["--timeout", "200ms"][..]] {
        let out = moltlock_home(home.path())
            .args(["run", "--key", &k, "--conflict-exit-code", "3"])
            .args(extra)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{extra:?}: {out:?}");
    }
    assert!(holder.wait().unwrap().success());
}

/// Item 11 (CLI side): with -v, a waiter says who holds the key and for how
/// long, then that it acquired the lock, with the fence.
#[test]
fn item11_waiting_says_who_holds_the_key() {
    let home = tempfile::tempdir().unwrap();
    let pidfile = home.path().join("pid");
    let k = key();
    let script = format!("echo $$ > {}; sleep 2", pidfile.display());
    let mut holder = moltlock_home(home.path())
        .args(["run", "--key", &k, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    let out = moltlock_home(home.path())
        .args(["run", "-v", "--key", &k, "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is held by") && err.contains("left); waiting"),
        "{err}"
    );
    // Who holds it, in the holder's own words: host, pid, since, command.
    let pid = format!("pid {} since ", holder.id());
    assert!(err.contains(&pid) && err.contains(": sh -c echo"), "{err}");
    assert!(err.contains("acquired") && err.contains("(fence "), "{err}");
    assert!(holder.wait().unwrap().success());
}

/// Item 11: the holder's description shows in `status` and in the busy
/// answer of `--no-wait`, and goes with the hold.
#[test]
fn item11_status_and_busy_answer_name_the_holder() {
    let home = tempfile::tempdir().unwrap();
    let pidfile = home.path().join("pid");
    let k = key();
    let script = format!("echo $$ > {}; sleep 2", pidfile.display());
    let mut holder = moltlock_home(home.path())
        .args(["run", "--key", &k, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    let pid = format!("pid {} since ", holder.id());
    let busy = moltlock_home(home.path())
        .args(["run", "--no-wait", "--key", &k, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(
        err.contains("is held by host ") && err.contains(&pid),
        "{err}"
    );
    let status = moltlock_home(home.path())
        .args(["status"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains("DESCRIPTION") && table.contains(&pid),
        "{table}"
    );
    let json = moltlock_home(home.path())
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&json.stdout).contains("\"description\""));
    assert!(holder.wait().unwrap().success());
    let after = moltlock_home(home.path())
        .args(["status"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&after.stdout);
    assert!(
        !table.contains(&pid),
        "the description outlived its hold: {table}"
    );
}

/// Item 11 and 8: a password in the command line never reaches the stored
/// description, so `status` cannot show it.
#[test]
fn item11_descriptions_keep_command_line_secrets_out() {
    let home = tempfile::tempdir().unwrap();
    let pidfile = home.path().join("pid");
    let k = key();
    let script = format!("echo $$ > {}; sleep 2", pidfile.display());
    let secret = "postgres://app:hunter2@db.internal/prod";
    let mut holder = moltlock_home(home.path())
        .args(["run", "--key", &k, "--", "sh", "-c", &script, secret])
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    let status = moltlock_home(home.path())
        .args(["status"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.contains("db.internal"), "{table}");
    assert!(!table.contains("hunter2"), "{table}");
    assert!(holder.wait().unwrap().success());
}

/// Item 12: `status` lines up 16-digit fences (Redis fences are the
/// server's time in µs) and shows time left as `12.3s`.
#[test]
fn item12_status_lines_up_long_fences() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let prefix = fixtures::redis::unique_prefix();
    let url = with_param(&redis.url(), &format!("key_prefix={prefix}"));
    let dir = tempfile::tempdir().unwrap();
    let k = key();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; sleep 2", pidfile.display());
    let mut holder = moltlock(&url)
        .args(["run", "--key", &k, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_pids(&pidfile, 1);
    let out = moltlock(&url)
        .args(["status", "--prefix", "cli/"])
        .output()
        .unwrap();
    holder.wait().unwrap();
    redis_clean(&redis_addr(&redis.url()), &prefix);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("KEY")).collect();
    assert!(lines.len() >= 2, "{text}");
    let fence = lines[1].split_whitespace().nth(1).unwrap();
    assert!(fence.len() >= 16, "fence {fence}: {text}");
    // Each column starts, in characters, where its heading does.
    let chars = |l: &str, byte: usize| l[..byte].chars().count();
    for heading in ["HOLDER", "DESCRIPTION"] {
        let at = chars(lines[0], lines[0].find(heading).unwrap());
        for l in &lines[1..] {
            let cell: String = l.chars().skip(at).collect();
            let before = l.chars().nth(at.saturating_sub(1));
            assert!(
                before == Some(' ') && !cell.starts_with(' '),
                "{heading} misaligned:\n{text}"
            );
        }
    }
    let left = lines[1].split_whitespace().nth(2).unwrap();
    assert!(
        left.ends_with('s') && left.contains('.'),
        "time left {left:?}: {text}"
    );
}

/// Item 12: `conformance` prints each case as `name  ok  time`, then the
/// summary.
#[test]
fn item12_conformance_prints_cases_with_times() {
    let dir = tempfile::tempdir().unwrap();
    let out = moltlock(&sqlite_url(dir.path()))
        .args(["conformance", "--only", "acquire_and_release"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("acquire_and_release "))
        .unwrap_or_else(|| panic!("{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[1], "ok", "{line}");
    assert!(words[2].ends_with('s'), "no time in {line:?}");
    assert!(
        text.trim_end().ends_with("1 passed, 0 failed, 0 skipped"),
        "{text}"
    );
}

/// Item 13: durations in the forms people type.
#[test]
fn item13_human_durations() {
    let home = tempfile::tempdir().unwrap();
    let out = moltlock_home(home.path())
        .args([
            "run",
            "--key",
            &key(),
            "--ttl",
            "1h30m",
            "--timeout",
            "90s",
            "--grace",
            "250ms",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Item 14: --fair works where the store has a fair queue (the default
/// SQLite store, etcd, Redis) and is a clear usage error elsewhere (a
/// migration in its `both` phase, where two queues cannot agree on an order).
#[test]
fn item14_fair_queue_where_there_is_one() {
    let home = tempfile::tempdir().unwrap();
    let out = moltlock_home(home.path())
        .args(["run", "--fair", "--key", &key(), "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let both = format!(
        "migrate+both:sqlite://{}|sqlite://{}",
        home.path().join("a.db").display(),
        home.path().join("b.db").display()
    );
    let out = moltlock(&both)
        .args(["run", "--fair", "--key", &key(), "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("fair queue"));
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    let out = moltlock(&etcd.url())
        .args(["run", "--fair", "--key", &key(), "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let prefix = fixtures::redis::unique_prefix();
    let url = with_param(
        &redis.url(),
        &format!("key_prefix={prefix}&fence_retention=60s"),
    );
    let out = moltlock(&url)
        .args(["run", "--fair", "--key", &key(), "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// The external check, on one store: SIGKILL of the wrapper leaves no
/// process of the command; SIGSTOP of the wrapper never lets the next holder
/// run beside the command; fences rise from holder to holder.
fn wrapper_faults_are_safe(url: &str) {
    let dir = tempfile::tempdir().unwrap();

    // SIGKILL.
    let pidfile = dir.path().join("killed");
    let k = key();
    let _forget_killed = fixtures::rows::Forget::new(url, &k);
    let mut wrapper = moltlock(url)
        .args(["run", "--key", &k, "--", "sh", "-c", &two_pids(&pidfile)])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = wait_pids(&pidfile, 2);
    wrapper.kill().unwrap();
    gone_within(&pids, Duration::from_secs(1));
    wrapper.wait().unwrap();
    steal_if_held(url, &k);

    // SIGSTOP, then the next holder.
    let k = key();
    let _forget_stopped = fixtures::rows::Forget::new(url, &k);
    let fences = sigstop_never_overlaps(&|| moltlock(url), dir.path(), "3s", &k);
    assert!(
        fences.len() == 2 && fences[1] > fences[0],
        "{url}: fences {fences:?}"
    );
}

/// Deletes the hold on `k` if one is left (a killed wrapper's, until its
/// TTL), so shared servers keep nothing.
fn steal_if_held(url: &str, k: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let backend = moltlock::connect(url).await.unwrap();
        let lk: moltlock::LockKey = k.parse().unwrap();
        if let Some(info) = backend.inspect(&lk).await.unwrap() {
            let _ = backend.delete(&lk, &info.holder).await;
        }
    });
}

#[test]
fn wrapper_faults_are_safe_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    wrapper_faults_are_safe(&sqlite_url(dir.path()));
}

#[test]
fn wrapper_faults_are_safe_on_redis() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let prefix = fixtures::redis::unique_prefix();
    let url = with_param(&redis.url(), &format!("key_prefix={prefix}"));
    let outcome = std::panic::catch_unwind(|| wrapper_faults_are_safe(&url));
    redis_clean(&redis_addr(&redis.url()), &prefix);
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn wrapper_faults_are_safe_on_postgres() {
    let url = fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
    wrapper_faults_are_safe(&url);
}

#[test]
fn wrapper_faults_are_safe_on_mysql() {
    let url = fixtures::mysql::shared_url().unwrap_or_else(|e| panic!("{e}"));
    wrapper_faults_are_safe(&url);
}

#[test]
fn wrapper_faults_are_safe_on_etcd() {
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    wrapper_faults_are_safe(&etcd.url());
}

/// `--at-least`: a job that ends at once keeps the key blocked for the
/// next run until its time, then frees it.
#[test]
fn at_least_blocks_the_next_run_until_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let started = Instant::now();
    let first = moltlock(&url)
        .args(["run", "--key", &k, "--at-least", "3s", "--", "true"])
        .output()
        .unwrap();
    assert!(first.status.success(), "{first:?}");
    let again = moltlock(&url)
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(2800),
        "too slow to check"
    );
    assert_eq!(
        again.status.code(),
        Some(75),
        "the next run was not blocked"
    );
    std::thread::sleep(
        (started + Duration::from_millis(3300)).saturating_duration_since(Instant::now()),
    );
    let later = moltlock(&url)
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert!(
        later.status.success(),
        "still blocked after --at-least: {later:?}"
    );
}

/// `--at-most`: a job that runs on is stopped at its time (status 125)
/// and the key is free for the next run at once.
#[test]
fn at_most_stops_a_job_that_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let started = Instant::now();
    let out = moltlock(&url)
        .args([
            "run",
            "--key",
            &k,
            "--ttl",
            "3s",
            "--grace",
            "300ms",
            "--at-most",
            "1500ms",
            "--",
            "sleep",
            "30",
        ])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        took >= Duration::from_millis(1100) && took < Duration::from_secs(3),
        "stopped after {took:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--at-most"), "{stderr}");
    let next = moltlock(&url)
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert!(next.status.success(), "the key stayed held: {next:?}");
}

/// `--at-least` survives a crash: with `moltlock run` SIGKILLed early, the
/// key stays blocked by the store's clock until the at-least time, not
/// only its (shorter) TTL.
#[test]
fn at_least_blocks_the_next_run_after_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let started = Instant::now();
    let mut holder = moltlock(&url)
        .args([
            "run",
            "--key",
            &k,
            "--ttl",
            "1s",
            "--at-least",
            "4s",
            "--",
            "sleep",
            "30",
        ])
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    holder.kill().unwrap();
    holder.wait().unwrap();
    std::thread::sleep(
        (started + Duration::from_millis(3000)).saturating_duration_since(Instant::now()),
    );
    let blocked = moltlock(&url)
        .args(["run", "--key", &k, "--no-wait", "--", "true"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(blocked.status.code(), Some(75), "free before --at-least");
    let out = moltlock(&url)
        .args(["run", "--key", &k, "--timeout", "5s", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "free before --at-least"
    );
}

/// `moltlock revoke` removes a running holder: its command is stopped
/// (status 125) and the key is free; revoking a free key says so (75).
#[test]
fn revoke_stops_the_holder_and_frees_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let holder = moltlock(&url)
        .args([
            "run", "--key", &k, "--ttl", "1s", "--grace", "300ms", "--", "sleep", "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    let revoked = moltlock(&url)
        .args(["revoke", "--key", &k])
        .output()
        .unwrap();
    assert!(revoked.status.success(), "{revoked:?}");
    assert!(String::from_utf8_lossy(&revoked.stdout).contains("revoked"));
    let out = holder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let again = moltlock(&url)
        .args(["revoke", "--key", &k])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(75), "{again:?}");
}

/// `moltlock revoke --ask` asks a running holder to let go: its command
/// gets SIGTERM (and exits with its own status), the hold is released,
/// and a free key has nobody to ask (75).
#[test]
fn revoke_ask_stops_the_command_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let script = "trap 'exit 3' TERM; sleep 30 & wait";
    let holder = moltlock(&url)
        .args([
            "run", "--key", &k, "--ttl", "3s", "--grace", "1s", "--", "sh", "-c", script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_held(&url, &k);
    let asked = moltlock(&url)
        .args(["revoke", "--ask", "--key", &k])
        .output()
        .unwrap();
    assert!(asked.status.success(), "{asked:?}");
    assert!(String::from_utf8_lossy(&asked.stdout).contains("asked the holder"));
    let took = Instant::now();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        took.elapsed() < Duration::from_secs(5),
        "the request took {:?}",
        took.elapsed()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("asked to release"),
        "{out:?}"
    );
    let again = moltlock(&url)
        .args(["revoke", "--ask", "--key", &k])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(75), "{again:?}");
}

/// `--at-most` no longer than the grace is refused before anything runs.
#[test]
fn at_most_must_outlast_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let out = moltlock(&url)
        .args([
            "run",
            "--key",
            &key(),
            "--grace",
            "2s",
            "--at-most",
            "1s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--at-most"));
}
