//! Two OS processes contend on one key in one SQLite file: their critical
//! sections never overlap, and fences grow in the order the sections ran.

use std::process::Command;

#[test]
fn separate_processes_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("shared.db").display());
    let log = dir.path().join("sections.log");
    let worker = env!("CARGO_BIN_EXE_sqlite-lock-worker");
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(worker)
                .args([db.as_str(), "jobs/shared", "40", &log.display().to_string()])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker failed");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut sections: Vec<(u32, u64, u128, u128)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(sections.len(), 80, "expected 80 critical sections");
    let pids: std::collections::HashSet<u32> = sections.iter().map(|s| s.0).collect();
    assert_eq!(pids.len(), 2, "both processes must have held the lock");
    sections.sort_by_key(|s| s.2);
    for pair in sections.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(a.3 <= b.2, "sections overlap: {a:?} and {b:?}");
        assert!(a.1 < b.1, "fence {} ran before fence {}", a.1, b.1);
    }
}
