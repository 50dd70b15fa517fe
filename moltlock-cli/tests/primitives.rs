//! `moltlock run --permits`, `--shared`/`--exclusive` and several `--key`s
//! end to end: the real binary, real processes, a real SQLite store.
#![allow(clippy::unwrap_used)] // helpers shared by the tests below unwrap like the tests do

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use moltlock_fixtures as fixtures;

mod common;
use common::{sqlite_url, steal};

const BIN: &str = env!("CARGO_BIN_EXE_moltlock");

fn moltlock(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env("MOLTLOCK_URL", url).env("NO_COLOR", "1");
    c
}

fn key() -> String {
    format!("cli/{}", moltlock::Token::random())
}

/// A shell command that logs `s <ns> <tag>` and `e <ns> <tag>` around a
/// sleep; the tag is expanded by the shell (so it can name variables).
fn section(log: &Path, tag: &str, sleep: &str) -> Vec<String> {
    let l = log.display();
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo s $(date +%s%N) {tag} >> {l}; sleep {sleep}; echo e $(date +%s%N) {tag} >> {l}"
        ),
    ]
}

/// `moltlock run` with `opts` around a logged section.
fn spawn_section(url: &str, opts: &[&str], log: &Path, tag: &str, sleep: &str) -> Child {
    moltlock(url)
        .arg("run")
        .args(opts)
        .args(["--ttl", "5s", "--"])
        .args(section(log, tag, sleep))
        .spawn()
        .unwrap()
}

/// The logged sections: (start ns, end ns, tag), by start.
fn sections(log: &Path) -> Vec<(u128, u128, String)> {
    let text = std::fs::read_to_string(log).unwrap();
    let mut open: Vec<(u128, String)> = Vec::new();
    let mut done = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ' ');
        let (kind, at, tag) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap_or(""));
        let at: u128 = at.parse().unwrap();
        if kind == "s" {
            open.push((at, tag.to_owned()));
        } else {
            let i = open.iter().position(|(_, t)| t == tag).unwrap();
            let (start, tag) = open.remove(i);
            done.push((start, at, tag));
        }
    }
    assert!(open.is_empty(), "unfinished sections:\n{text}");
    done.sort();
    done
}

/// The most sections in progress at once.
fn most_at_once(sections: &[(u128, u128, String)]) -> usize {
    let mut marks: Vec<(u128, i32)> = Vec::new();
    for (s, e, _) in sections {
        // At equal times an end comes first: that is no overlap.
        marks.push((*s, 1));
        marks.push((*e, -1));
    }
    marks.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in marks {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap()
}

fn overlap(a: &(u128, u128, String), b: &(u128, u128, String)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn wait_all(children: Vec<Child>) {
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
}

/// Polls `moltlock status --json` until `pred` holds for its rows.
fn wait_rows(url: &str, pred: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let out = moltlock(url).args(["status", "--json"]).output().unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if pred(&rows) {
            return rows;
        }
        assert!(Instant::now() < until, "status never matched: {rows:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Rows of `lock` with `role`.
fn count(rows: &[serde_json::Value], lock: &str, role: &str) -> usize {
    rows.iter()
        .filter(|r| r["lock"] == lock && r["role"] == role)
        .count()
}

/// How many of `keys` the rows hold.
fn held(rows: &[serde_json::Value], keys: &[&str]) -> usize {
    rows.iter()
        .filter(|r| keys.iter().any(|k| r["key"] == *k))
        .count()
}

/// Five runs with `--permits 2`: never more than two inside at once, and
/// two do run together; each sees MOLTLOCK_SLOT 0 or 1.
#[test]
fn permits_bound_how_many_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    permits_bound(&sqlite_url(dir.path()));
}

fn permits_bound(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let k = key();
    let started = Instant::now();
    let children = (0..5)
        .map(|i| {
            let tag = format!("{i}:$MOLTLOCK_SLOT:$MOLTLOCK_FENCE");
            spawn_section(url, &["--key", &k, "--permits", "2"], &log, &tag, "0.4")
        })
        .collect();
    wait_all(children);
    let done = sections(&log);
    assert_eq!(done.len(), 5);
    assert_eq!(most_at_once(&done), 2, "{done:?}");
    for (_, _, tag) in &done {
        let parts: Vec<&str> = tag.split(':').collect();
        assert!(["0", "1"].contains(&parts[1]), "slot {tag}");
        assert!(parts[2].parse::<u64>().is_ok(), "fence {tag}");
    }
    eprintln!(
        "5 runs of 0.4s under 2 permits took {:?}",
        started.elapsed()
    );
}

/// `--permits` busy and timed out: 75 and 124, naming the permits' holders;
/// then the freed permit is taken.
#[test]
fn permits_busy_and_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let sem = ["run", "--key", &k, "--permits", "1"];
    let mut holder = moltlock(&url)
        .args(sem)
        .args(["--", "sleep", "1.5"])
        .spawn()
        .unwrap();
    wait_rows(&url, |rows| count(rows, &k, "permit") == 1);
    let busy = moltlock(&url)
        .args(sem)
        .args(["--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(75));
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(
        err.contains(&format!("{k:?} permit 0 is held by host ")),
        "{err}"
    );
    let late = moltlock(&url)
        .args(sem)
        .args(["--timeout", "200ms", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(124));
    let waited = moltlock(&url)
        .args(sem)
        .args(["--timeout", "10s", "--", "true"])
        .output()
        .unwrap();
    assert!(waited.status.success());
    assert!(holder.wait().unwrap().success());
}

/// Shared runs overlap; an exclusive run overlaps none; a shared run that
/// comes while the exclusive one waits runs after it (writer preference).
#[test]
fn shared_runs_overlap_and_exclusive_runs_alone() {
    let dir = tempfile::tempdir().unwrap();
    shared_and_exclusive(&sqlite_url(dir.path()));
}

fn shared_and_exclusive(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let k = key();
    let shared = ["--key", &k, "--shared", "--readers", "4"];
    let exclusive = ["--key", &k, "--exclusive", "--readers", "4"];
    let mut children: Vec<Child> = (0..2)
        .map(|i| spawn_section(url, &shared, &log, &format!("r{i}:$MOLTLOCK_MODE"), "1"))
        .collect();
    wait_rows(url, |rows| count(rows, &k, "reader") == 2);
    children.push(spawn_section(
        url,
        &exclusive,
        &log,
        "w:$MOLTLOCK_MODE",
        "0.3",
    ));
    wait_rows(url, |rows| count(rows, &k, "writer") == 1);
    children.push(spawn_section(
        url,
        &shared,
        &log,
        "late:$MOLTLOCK_MODE",
        "0.2",
    ));
    wait_all(children);
    let done = sections(&log);
    let find = |tag: &str| done.iter().find(|s| s.2.starts_with(tag)).unwrap();
    let (r0, r1, w, late) = (find("r0"), find("r1"), find("w:"), find("late"));
    assert!(overlap(r0, r1), "shared runs did not overlap: {done:?}");
    for other in [r0, r1, late] {
        assert!(!overlap(w, other), "the exclusive run overlapped: {done:?}");
    }
    assert!(
        late.0 > w.1,
        "a new reader got in before the waiting writer: {done:?}"
    );
    assert!(
        w.2.ends_with(":exclusive") && r0.2.ends_with(":shared"),
        "{done:?}"
    );
}

/// A two-key run excludes a single-key run of either key, and a held key
/// keeps the two-key run out; the command gets each key's fence.
#[test]
fn multi_lock_excludes_runs_of_each_key() {
    let dir = tempfile::tempdir().unwrap();
    multi_excludes(&sqlite_url(dir.path()));
}

fn multi_excludes(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("env");
    let base = key();
    let (a, b) = (format!("{base}/a"), format!("{base}/b"));
    let script = format!(
        "echo $MOLTLOCK_KEYS $MOLTLOCK_KEY_0 $MOLTLOCK_FENCE_0 $MOLTLOCK_KEY_1 $MOLTLOCK_FENCE_1 \
         > {}; sleep 1.5",
        out_file.display()
    );
    let mut multi = moltlock(url)
        .args(["run", "--key", &b, "--key", &a, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_rows(url, |rows| held(rows, &[&a, &b]) == 2);
    for k in [&a, &b] {
        let single = moltlock(url)
            .args(["run", "--key", k, "--no-wait", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(single.status.code(), Some(75), "{k} was free");
    }
    assert!(multi.wait().unwrap().success());
    let env = std::fs::read_to_string(&out_file).unwrap();
    let f: Vec<&str> = env.split_whitespace().collect();
    assert_eq!((f[0], f[1], f[3]), ("2", a.as_str(), b.as_str()), "{env}");
    assert!(
        f[2].parse::<u64>().is_ok() && f[4].parse::<u64>().is_ok(),
        "{env}"
    );

    let mut single = moltlock(url)
        .args(["run", "--key", &b, "--", "sleep", "1"])
        .spawn()
        .unwrap();
    wait_rows(url, |rows| held(rows, &[&a, &b]) == 1);
    let busy = moltlock(url)
        .args(["run", "--key", &a, "--key", &b, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(75));
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(err.contains(&format!("{b:?} is held by host ")), "{err}");
    assert!(single.wait().unwrap().success());
    let after = moltlock(url)
        .args(["run", "--key", &a, "--key", &b, "--no-wait", "--", "true"])
        .output()
        .unwrap();
    assert!(after.status.success(), "both keys were given back");
}

/// `status` groups a semaphore's permits and a read-write lock's readers
/// and writer under their names, without the raw derived keys.
#[test]
fn status_shows_permits_and_readers() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let (sem, rw) = (key(), key());
    let run = |opts: &[&str], sleep: &str| {
        moltlock(&url)
            .arg("run")
            .args(opts)
            .args(["--", "sleep", sleep])
            .spawn()
            .unwrap()
    };
    let mut children = vec![
        run(&["--key", &sem, "--permits", "3"], "2"),
        run(&["--key", &sem, "--permits", "3"], "2"),
        run(&["--key", &rw, "--shared"], "2"),
        run(&["--key", &rw, "--shared"], "2"),
    ];
    wait_rows(&url, |rows| {
        count(rows, &sem, "permit") == 2 && count(rows, &rw, "reader") == 2
    });
    let out = moltlock(&url).args(["status"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!("{sem}: 2 of ? permits in use")),
        "{table}"
    );
    assert!(table.contains(&format!("{rw}: 2 readers\n")), "{table}");
    assert!(
        table.contains("  permit ") && table.contains("  reader "),
        "{table}"
    );
    assert!(table.contains("pid ") && !table.contains("#~"), "{table}");
    for c in &mut children {
        assert!(c.wait().unwrap().success());
    }
    let mut writer = run(&["--key", &rw, "--exclusive"], "1");
    // The writer holds its key and all 16 reader slots (the default).
    wait_rows(&url, |rows| {
        count(rows, &rw, "writer") == 1 && count(rows, &rw, "reader") == 16
    });
    let out = moltlock(&url).args(["status"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!(
            "{rw}: held by a writer (16 reader slots)\n  writer "
        )),
        "{table}"
    );
    assert!(!table.contains("  reader "), "{table}");
    assert!(writer.wait().unwrap().success());
}

/// A lost permit, a lost writer key and a lost key of several stop the
/// command with 125, naming what was lost.
#[test]
fn lost_parts_stop_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let k = key();
    let cases: [(&[&str], String); 3] = [
        (&["--permits", "2"], format!("{k}#~s")),
        (&["--exclusive"], format!("{k}#~w")),
        (&["--key", "zz-other"], k.clone()),
    ];
    for (opts, lose) in cases {
        let slot_file = dir.path().join("slot");
        let _ = std::fs::remove_file(&slot_file);
        let script = format!("echo $MOLTLOCK_SLOT > {}; sleep 30", slot_file.display());
        let holder = moltlock(&url)
            .args(["run", "--key", &k, "--ttl", "1s", "--grace", "400ms"])
            .args(opts)
            .args(["--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while !slot_file.exists() {
            assert!(Instant::now() < until, "the command never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        let slot = std::fs::read_to_string(&slot_file).unwrap();
        let lose = if lose.ends_with("#~s") {
            format!("{lose}{}", slot.trim())
        } else {
            lose
        };
        steal(&url, &lose);
        let started = Instant::now();
        let out = holder.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{opts:?}: {err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{opts:?}");
        assert!(
            err.contains("lost the lock on ") && !err.contains("#~"),
            "{err}"
        );
    }
}

/// SIGKILL of `moltlock` kills a `--shared` command too (the same watchdog).
#[test]
fn sigkill_of_a_shared_run_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 600", pidfile.display());
    let mut wrapper = moltlock(&url)
        .args([
            "run",
            "--key",
            &key(),
            "--shared",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let pid: u32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        assert!(Instant::now() < until, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    wrapper.kill().unwrap();
    wrapper.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    }) {
        assert!(Instant::now() < until, "the command outlived moltlock");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Options that do not go together are usage errors (64).
#[test]
fn mode_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    for bad in [
        &["--key", "a", "--readers", "2"][..],
        &["--key", "a", "--key", "b", "--permits", "2"],
        &["--key", "a", "--shared", "--exclusive"],
        &["--key", "a", "--permits", "0"],
        &["--key", "a", "--permits", "2", "--fair"],
    ] {
        let out = moltlock(&url)
            .arg("run")
            .args(bad)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{bad:?}");
    }
    let help = moltlock(&url).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for word in [
        "--permits",
        "--shared",
        "--exclusive",
        "--readers",
        "MOLTLOCK_SLOT",
        "MOLTLOCK_FENCE_<i>",
    ] {
        assert!(help.contains(word), "{word} missing from --help:\n{help}");
    }
}

/// The three kinds on Redis and etcd, whose backends take a set of keys
/// in one request.
#[test]
fn kinds_on_redis_and_etcd() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    for url in [redis.url(), etcd.url()] {
        permits_bound(&url);
        shared_and_exclusive(&url);
        multi_excludes(&url);
    }
}
