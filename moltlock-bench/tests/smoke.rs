//! A smoke run of the built harness (tiny durations, few locks) against
//! SQLite in a temp file, and against Redis, Postgres, etcd and MySQL when
//! they are available, so the harness cannot rot. It checks real things:
//! every section is present, cycles were done, no two tasks ever held the
//! contended key at once, renewal kept every lock, semaphore waiters never
//! starved, and `lock_all` issued the requests its path implies (one
//! `cas_multi`, or one `cas` per key with it hidden).

use std::process::Command;

use serde_json::Value;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moltlock-bench"))
}

/// Runs the harness as `cmd` says; it must exit successfully (its stderr
/// in the failure).
fn succeeds(cmd: &mut Command) -> std::process::Output {
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("run moltlock-bench: {e}"),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    out
}

const TINY: [&str; 18] = [
    "--duration",
    "150ms",
    "--locks",
    "40",
    "--renew-ttl",
    "300ms",
    "--tasks",
    "4",
    "--contenders",
    "3",
    "--hold",
    "1ms",
    "--max-cycles",
    "20000",
    "--permits",
    "2",
    "--multi-keys",
    "4",
];

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("bench.db").display())
}

/// The other stores that answer here; the guards keep owned servers alive.
fn other_stores() -> (Vec<String>, Vec<Box<dyn std::any::Any>>) {
    let mut urls = Vec::new();
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    match moltlock_fixtures::redis::redis() {
        Ok(r) => {
            urls.push(r.url());
            keep.push(Box::new(r));
        }
        Err(e) => eprintln!("smoke: no Redis ({e}); skipping it"),
    }
    match moltlock_fixtures::postgres::shared_url() {
        Ok(u) => urls.push(u),
        Err(e) => eprintln!("smoke: no Postgres ({e}); skipping it"),
    }
    match moltlock_fixtures::etcd::etcd() {
        Ok(e) => {
            urls.push(e.url());
            keep.push(Box::new(e));
        }
        Err(e) => eprintln!("smoke: no etcd ({e}); skipping it"),
    }
    match moltlock_fixtures::mysql::shared_url() {
        Ok(u) => urls.push(u),
        Err(e) => eprintln!("smoke: no MySQL ({e}); skipping it"),
    }
    (urls, keep)
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64().unwrap_or(f64::NAN)
}

fn near(v: f64, want: f64) -> bool {
    (want..=want + 0.5).contains(&v)
}

/// Three contenders for two permits, and one task alone, each next to a
/// plain lock.
fn check_semaphore(store: &str, sem: &Value) {
    let Some(runs) = sem["runs"].as_array() else {
        panic!("{store}: no semaphore runs in {sem}");
    };
    let tasks: Vec<f64> = runs.iter().map(|r| num(r, &["tasks"])).collect();
    assert_eq!(tasks, [1.0, 3.0], "{store}: semaphore task counts");
    for r in runs {
        for what in ["mutex", "semaphore"] {
            let p = &r[what];
            let n = num(p, &["cycles", "tasks"]);
            assert!(
                num(p, &["cycles", "cycles"]) > 0.0,
                "{store}: no {what} cycles ({n} tasks)"
            );
            assert_eq!(
                num(p, &["timeouts"]),
                0.0,
                "{store}: a {what} waiter starved"
            );
            assert!(
                num(p, &["requests", "acquire"]) >= 1.0,
                "{store}: {what} requests"
            );
            assert!(
                num(p, &["requests", "delete"]) >= 1.0,
                "{store}: {what} releases"
            );
        }
    }
}

/// Uncontended `lock_all`: one `cas_multi` per acquisition where the
/// backend has it (and takes that many keys), one `cas` per key otherwise
/// and always with it hidden; one `delete` per key.
fn check_lock_all(store: &str, all: &Value) {
    let keys = num(all, &["keys"]);
    assert_eq!(keys, 4.0, "{store}: lock_all keys");
    let max = all["max_keys"].as_f64().unwrap_or(f64::INFINITY);
    let native = all["cas_multi"].as_bool() == Some(true) && max >= keys;
    for (which, batched) in [("as_is", native), ("hidden", false)] {
        let p = &all[which];
        assert!(
            num(p, &["cycles", "cycles"]) > 0.0,
            "{store}: no {which} cycles"
        );
        let (cas, multi) = (
            num(p, &["requests", "cas"]),
            num(p, &["requests", "cas_multi"]),
        );
        let want = if batched { (0.0, 1.0) } else { (keys, 0.0) };
        assert!(
            near(cas, want.0) && near(multi, want.1),
            "{store} {which}: {cas} cas, {multi} cas_multi"
        );
        assert!(
            near(num(p, &["requests", "delete"]), keys),
            "{store} {which}: deletes"
        );
    }
}

fn check_backend(b: &Value) {
    let store = b["store"].as_str().unwrap_or("?");
    assert!(b["error"].is_null(), "{store}: {}", b["error"]);
    for section in ["floor", "uncontended", "floor_parallel", "parallel"] {
        assert!(
            num(b, &[section, "cycles"]) > 0.0,
            "{store}: no {section} cycles"
        );
        assert!(
            num(b, &[section, "latency", "p50_us"]) > 0.0,
            "{store}: {section}"
        );
    }
    assert!(
        num(b, &["rtt", "count"]) > 0.0,
        "{store}: no floor commands timed"
    );
    assert!(
        num(b, &["bare_rtt", "count"]) > 0.0,
        "{store}: no bare round trips"
    );
    let c = &b["contended"];
    assert!(num(c, &["acquisitions"]) > 0.0, "{store}: nothing acquired");
    assert_eq!(num(c, &["overlaps"]), 0.0, "{store}: two holders at once");
    assert_eq!(num(c, &["timeouts"]), 0.0, "{store}: a contender starved");
    assert!(
        num(c, &["requests_per_acquisition"]) >= 1.0,
        "{store}: store requests per acquisition not counted"
    );
    assert_eq!(
        num(c, &["fence_backwards"]),
        0.0,
        "{store}: a fence went back"
    );
    let shared = &b["contended_shared"];
    assert!(
        num(shared, &["acquisitions"]) > 0.0,
        "{store}: shared manager acquired nothing"
    );
    assert_eq!(num(shared, &["overlaps"]), 0.0, "{store}: shared overlap");
    assert_eq!(
        num(shared, &["fence_backwards"]),
        0.0,
        "{store}: shared fence went back"
    );
    if !b["contended_fair"].is_null() {
        assert_eq!(
            num(&b["contended_fair"], &["overlaps"]),
            0.0,
            "{store}: fair overlap"
        );
    }
    check_semaphore(store, &b["semaphore"]);
    check_lock_all(store, &b["lock_all"]);
    let r = &b["renewal"];
    assert_eq!(num(r, &["locks"]), 40.0, "{store}: renewal locks");
    assert_eq!(num(r, &["lost"]), 0.0, "{store}: renewal lost holds");
    assert!(
        num(r, &["renewed_per_interval"]) > 0.0,
        "{store}: nothing renewed"
    );
    assert!(
        num(r, &["rounds_per_interval"]) > 0.0,
        "{store}: no renewal rounds"
    );
}

#[test]
fn every_store_end_to_end_as_json_with_peers_and_chart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut urls, _servers) = other_stores();
    urls.insert(0, sqlite_url(&dir));
    let svg = dir.path().join("handoff.svg");
    let mut cmd = bench();
    for u in &urls {
        cmd.arg("--url").arg(u);
    }
    cmd.args(TINY)
        .arg("--peers")
        .arg("--json")
        .arg("--svg")
        .arg(&svg);
    let out = succeeds(&mut cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let backends = report["backends"].as_array().expect("backends");
    assert_eq!(backends.len(), urls.len(), "{stderr}");
    for b in backends {
        check_backend(b);
    }
    for p in report["peers"].as_array().expect("peers") {
        let name = p["name"].as_str().unwrap_or("?");
        assert!(p["error"].is_null(), "{name}: {}", p["error"]);
        assert!(num(p, &["uncontended", "cycles"]) > 0.0, "{name}");
        assert_eq!(num(&p["contended"], &["overlaps"]), 0.0, "{name}: overlap");
    }
    assert!(report["checks"].as_array().is_some_and(|c| !c.is_empty()));
    let chart = std::fs::read_to_string(&svg).expect("chart written");
    assert!(
        chart.starts_with("<svg") && chart.contains("moltlock sqlite"),
        "{chart}"
    );
}

#[test]
fn markdown_has_every_section() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = succeeds(bench().arg("--url").arg(sqlite_url(&dir)).args(TINY));
    let text = String::from_utf8_lossy(&out.stdout);
    for section in [
        "### Summary",
        "| sqlite | ",
        "### sqlite (RTT p50 ",
        "| floor (the store's recipe, raw client) | ",
        "| moltlock, one shared manager | – | – | ",
        "### Floor, uncontended and parallel",
        "### Contended: 3 tasks on one key",
        "### Renewal at scale",
        "### Targets",
        "| moltlock sqlite | default |",
        "### Semaphore of 2 permits next to a plain lock",
        "| sqlite | native | 3 | semaphore(2) |",
        "### lock_all of 4 keys",
        "| sqlite | native | as is (cas_multi) |",
        "| sqlite | hidden | cas_multi hidden (one cas per key) |",
    ] {
        assert!(text.contains(section), "missing {section:?} in\n{text}");
    }
    assert!(!text.contains("error:"), "{text}");
    let first = text.find("### ").and_then(|at| text[at..].lines().next());
    assert_eq!(first, Some("### Summary"), "the summary opens the report");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("temp dir")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.contains("-floor-"))
        .collect();
    assert!(left.is_empty(), "the floor's database stayed: {left:?}");
}

/// `--only` runs just the sections named (the new ones here), on SQLite
/// and on the shared Redis and Postgres where they answer.
#[test]
fn only_the_sections_asked_for() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut urls = vec![sqlite_url(&dir)];
    let redis = moltlock_fixtures::redis::redis();
    if let Ok(r) = &redis {
        urls.push(r.url());
    }
    if let Ok(u) = moltlock_fixtures::postgres::shared_url() {
        urls.push(u);
    }
    let mut cmd = bench();
    for u in &urls {
        cmd.arg("--url").arg(u);
    }
    let out = succeeds(
        cmd.args(TINY)
            .args(["--only", "semaphore,lock-all", "--json"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let sections = &report["settings"]["sections"];
    assert_eq!(sections, &serde_json::json!(["semaphore", "lock-all"]));
    let backends = report["backends"].as_array().expect("backends");
    assert_eq!(backends.len(), urls.len(), "{stderr}");
    for b in backends {
        let store = b["store"].as_str().unwrap_or("?");
        assert!(b["error"].is_null(), "{store}: {}", b["error"]);
        assert_eq!(num(b, &["floor", "cycles"]), 0.0, "{store}: floor ran");
        assert!(
            b["contended"].is_null() && b["renewal"].is_null(),
            "{store}"
        );
        check_semaphore(store, &b["semaphore"]);
        check_lock_all(store, &b["lock_all"]);
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let out = bench()
        .args(["--url", "nope://x", "--duration", "10ms", "--locks", "0"])
        .output();
    let out = out.expect("run moltlock-bench");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("error:"));
    let out = bench()
        .args(["--url", "sqlite://x.db", "--duration", "soon"])
        .output();
    let out = out.expect("run moltlock-bench");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
}

/// The counting wrapper forwards every extension of what it wraps (it once
/// dropped `raise_fence`).
#[test]
fn counting_wrapper_exposes_the_inner_extensions() {
    use moltlock::extension::extensions;
    let inner: std::sync::Arc<dyn moltlock::Backend> =
        std::sync::Arc::new(moltlock::MemoryBackend::new());
    let (counting, _reader) = moltlock_bench::counting::Counting::new(inner.clone());
    assert_eq!(extensions(&counting), extensions(&*inner));
}

/// The memory probe, run as the renewal section runs it, measures what
/// held locks cost in a fresh process: thousands of holds cost far more
/// than nothing (a resident set read in a process that had freed memory to
/// reuse showed 0 bytes per lock), and less than a page each.
#[test]
fn the_memory_probe_sees_what_holds_cost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("probe.db").display());
    let out = succeeds(bench().args(["--url", &url, "--memory-probe", "--locks", "4000"]));
    let text = String::from_utf8_lossy(&out.stdout);
    let bytes: f64 = text.trim().parse().expect("a number");
    assert!(
        (100.0..4096.0).contains(&bytes),
        "{bytes} bytes per held lock"
    );
}

/// Rows of the run's lock keys left in a SQL backend's table.
async fn rows_left(url: &str, prefix: &str) -> Result<i64, sqlx::Error> {
    let pattern = format!("{prefix}%");
    if url.starts_with("mysql") {
        let pool = sqlx::MySqlPool::connect(url).await?;
        let n = sqlx::query_scalar("SELECT count(*) FROM moltlock_locks WHERE lock_key LIKE ?")
            .bind(&pattern)
            .fetch_one(&pool)
            .await;
        pool.close().await;
        n
    } else {
        let pool = sqlx::PgPool::connect(url).await?;
        let n = sqlx::query_scalar("SELECT count(*) FROM moltlock_locks WHERE key LIKE $1")
            .bind(&pattern)
            .fetch_one(&pool)
            .await;
        pool.close().await;
        n
    }
}

/// Postgres and MySQL keep a released key's row (for its fences): a run
/// deletes its keys' rows at its end, so runs do not grow the shared
/// tables. The memory probe, which has no cleanup of its own, shows the
/// rows a run leaves before that.
#[tokio::test]
async fn a_run_leaves_no_rows_in_the_sql_tables() {
    let mut urls = Vec::new();
    urls.extend(moltlock_fixtures::postgres::shared_url());
    urls.extend(moltlock_fixtures::mysql::shared_url());
    for url in urls {
        let run = format!("smoke{}", std::process::id());
        let prefix = format!("bench/{run}/");
        let probe = ["--memory-probe", "--locks", "6"];
        succeeds(bench().args(["--url", &url, "--run-id", &run]).args(probe));
        let before = rows_left(&url, &prefix).await.expect("count the rows");
        assert!(before > 0, "{url}: the probe left no rows to clean");
        let args = [
            "--url",
            &url,
            "--run-id",
            &run,
            "--only",
            "throughput",
            "--duration",
            "100ms",
        ];
        succeeds(bench().args(args).args(["--locks", "0"]));
        let after = rows_left(&url, &prefix).await.expect("count the rows");
        assert_eq!(after, 0, "{url}: rows left after the run");
    }
}
