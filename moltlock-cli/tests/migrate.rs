//! A rolling migration from Redis to etcd: workers in adjacent phases share
#![allow(clippy::unwrap_used)] // helpers shared by the tests below unwrap like the tests do
//! a key with no overlap and fences that never go backwards; workers two
//! phases apart (old and new) overlap, which is why phases must be adjacent.

use std::path::Path;
use std::process::Command;
use std::thread;

use moltlock_fixtures as fixtures;

const BIN: &str = env!("CARGO_BIN_EXE_moltlock");

/// One event of the shared log: (time ns, is start, fence).
type Event = (u128, bool, u64);

fn url(phase: &str, redis: &str, etcd: &str) -> String {
    format!("migrate+{phase}:{redis}|{etcd}")
}

/// `rounds` sections, one `moltlock run` each, under `url`.
fn worker(
    url: String,
    key: String,
    log: String,
    rounds: u32,
    hold: &'static str,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let script = format!(
            "echo s $(date +%s%N) $MOLTLOCK_FENCE >> {log}; sleep {hold}; \
             echo e $(date +%s%N) $MOLTLOCK_FENCE >> {log}"
        );
        for _ in 0..rounds {
            let status = Command::new(BIN)
                .env("MOLTLOCK_URL", &url)
                .args([
                    "run",
                    "--key",
                    &key,
                    "--ttl",
                    "5s",
                    "--timeout",
                    "60s",
                    "--",
                ])
                .args(["sh", "-c", &script])
                .status()
                .unwrap();
            assert!(status.success(), "a worker under {url} failed: {status}");
        }
    })
}

fn events(log: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(log).unwrap();
    let mut out: Vec<Event> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[1].parse().unwrap(), f[0] == "s", f[2].parse().unwrap())
        })
        .collect();
    out.sort_by_key(|e| (e.0, !e.1));
    out
}

/// How many sections started while another was running.
fn overlaps(events: &[Event]) -> usize {
    let (mut inside, mut overlaps) = (0i32, 0usize);
    for (_, start, _) in events {
        if *start {
            overlaps += usize::from(inside > 0);
            inside += 1;
        } else {
            inside -= 1;
        }
    }
    overlaps
}

/// Fences of the sections in the order they started; must strictly grow.
fn fences_in_order(events: &[Event]) -> Vec<u64> {
    events.iter().filter(|e| e.1).map(|e| e.2).collect()
}

fn mixed_fleet(phases: [&str; 2], redis: &str, etcd: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let key = format!("migrate/{}", moltlock::Token::random());
    let mut handles = Vec::new();
    for phase in phases {
        for _ in 0..3 {
            let u = url(phase, redis, etcd);
            handles.push(worker(u, key.clone(), log.display().to_string(), 3, "0.05"));
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let events = events(&log);
    assert_eq!(events.len(), 36, "expected 18 sections");
    assert_eq!(
        overlaps(&events),
        0,
        "phases {phases:?} overlapped: {events:?}"
    );
    let fences = fences_in_order(&events);
    for pair in fences.windows(2) {
        assert!(
            pair[0] < pair[1],
            "phases {phases:?}: fence {} then {}",
            pair[0],
            pair[1]
        );
    }
}

#[test]
fn adjacent_phases_never_overlap_and_fences_grow() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    let (r, e) = (redis.url(), etcd.url());
    mixed_fleet(["old", "both"], &r, &e);
    mixed_fleet(["both", "new"], &r, &e);
    // Rolling back walks the same pairs the other way.
    mixed_fleet(["new", "both"], &r, &e);
}

#[test]
fn old_and_new_together_overlap() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    let (r, e) = (redis.url(), etcd.url());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let key = format!("migrate/{}", moltlock::Token::random());
    let old = worker(
        url("old", &r, &e),
        key.clone(),
        log.display().to_string(),
        1,
        "1",
    );
    let new = worker(url("new", &r, &e), key, log.display().to_string(), 1, "1");
    old.join().unwrap();
    new.join().unwrap();
    let events = events(&log);
    assert_eq!(events.len(), 4);
    assert_eq!(
        overlaps(&events),
        1,
        "an old-phase and a new-phase worker share no store, so both hold at once: {events:?}"
    );
}

#[test]
fn status_shows_both_stores() {
    let redis = fixtures::redis::redis().unwrap_or_else(|e| panic!("{e}"));
    let etcd = fixtures::etcd::etcd().unwrap_or_else(|e| panic!("{e}"));
    let u = url("both", &redis.url(), &etcd.url());
    let key = format!("migrate-status/{}", moltlock::Token::random());
    let mut holder = Command::new(BIN)
        .env("MOLTLOCK_URL", &u)
        .args(["run", "--key", &key, "--", "sleep", "3"])
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let doc = loop {
        let out = Command::new(BIN)
            .env("MOLTLOCK_URL", &u)
            .args(["status", "--prefix", "migrate-status/", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let has = |side: &str| {
            doc[side]
                .as_array()
                .is_some_and(|a| a.iter().any(|r| r["key"] == key.as_str()))
        };
        if has("old") && has("new") {
            break doc;
        }
        assert!(
            std::time::Instant::now() < until,
            "the hold never showed in both stores: {doc}"
        );
        thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(doc["phase"], "both");
    holder.wait().unwrap();
}
