//! The fault suite: every scenario against every backend where it applies,
//! each on servers this test starts itself, with worker processes from the
//! `fault-worker` binary. Each test records its row of the report under
//! `target/tmp/moltlock-faults/` (`report.md` holds the table so far).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use moltlock_faults::harness::{self, Harness, Outcome, Target};
use moltlock_faults::proxy::Mode;
use moltlock_fixtures as fixtures;
use moltlock_fixtures::clock::FakeClock;

const BIN: &str = env!("CARGO_BIN_EXE_fault-worker");

/// TTL for Redis, Postgres and SQLite.
const TTL: Duration = Duration::from_secs(2);
/// TTL for etcd (its lease floor is 2 s; leave room).
const ETCD_TTL: Duration = Duration::from_secs(3);

fn report_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("moltlock-faults")
}

fn conclude(out: &Outcome) {
    out.record(&report_dir());
    assert!(out.passed(), "{}", out.explain());
}

fn harness() -> Harness {
    Harness::new(BIN, false).expect("harness")
}

fn redis(r: &fixtures::redis::OwnedRedis) -> Target {
    Target {
        backend: "redis",
        url: r.url(),
        ttl: TTL,
    }
}

fn postgres_shared() -> Target {
    Target {
        backend: "postgres",
        url: fixtures::postgres::shared_url().expect("postgres"),
        ttl: TTL,
    }
}

fn sqlite(h: &Harness) -> Target {
    Target {
        backend: "sqlite",
        url: format!("sqlite://{}", h.dir().join("locks.db").display()),
        ttl: TTL,
    }
}

fn etcd(m: &fixtures::etcd::EtcdMember) -> Target {
    Target {
        backend: "etcd",
        url: format!("etcd://{}", m.endpoint()),
        ttl: ETCD_TTL,
    }
}

// ---- holder killed (SIGKILL) ----

#[test]
fn sigkill_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    conclude(&harness::holder_killed(&h, &redis(&r)));
}

#[test]
fn sigkill_postgres() {
    let t = postgres_shared();
    let h = harness();
    conclude(&harness::holder_killed(&h, &t));
}

#[test]
fn sigkill_sqlite() {
    let h = harness();
    let t = sqlite(&h);
    conclude(&harness::holder_killed(&h, &t));
}

#[test]
fn sigkill_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = harness();
    conclude(&harness::holder_killed(&h, &etcd(&e)));
}

// ---- holder paused (SIGSTOP past the TTL, then SIGCONT) ----

#[test]
fn sigstop_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    conclude(&harness::holder_paused(&h, &redis(&r), false));
}

#[test]
fn sigstop_postgres() {
    let t = postgres_shared();
    let h = harness();
    conclude(&harness::holder_paused(&h, &t, false));
}

#[test]
fn sigstop_sqlite() {
    let h = harness();
    let t = sqlite(&h);
    conclude(&harness::holder_paused(&h, &t, false));
}

#[test]
fn sigstop_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = harness();
    conclude(&harness::holder_paused(&h, &etcd(&e), false));
}

// ---- the leader of an election killed (SIGKILL) or paused (SIGSTOP) ----

/// Workers that campaign in an election on the key: each section is one
/// term of leadership, so an overlap the checker finds is two leaders.
fn electing() -> Harness {
    harness().electing()
}

/// Names an election run of a holder scenario as its own row.
fn as_election(mut out: Outcome) -> Outcome {
    out.scenario = out.scenario.replace("holder", "leader");
    out
}

#[test]
fn leader_sigkill_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = electing();
    conclude(&as_election(harness::holder_killed(&h, &etcd(&e))));
}

#[test]
fn leader_sigkill_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = electing();
    conclude(&as_election(harness::holder_killed(&h, &redis(&r))));
}

#[test]
fn leader_sigkill_postgres() {
    let t = postgres_shared();
    let h = electing();
    conclude(&as_election(harness::holder_killed(&h, &t)));
}

#[test]
fn leader_sigstop_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = electing();
    conclude(&as_election(harness::holder_paused(&h, &etcd(&e), false)));
}

#[test]
fn leader_sigstop_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = electing();
    conclude(&as_election(harness::holder_paused(&h, &redis(&r), false)));
}

#[test]
fn leader_sigstop_postgres() {
    let t = postgres_shared();
    let h = electing();
    conclude(&as_election(harness::holder_paused(&h, &t, false)));
}

// ---- the checker catches unsafe locks ----

/// A holder that ignores its validity deadline (keeps believing it holds
/// after `lost()`) overlaps the next holder: the checker must say so.
#[test]
fn checker_catches_holder_ignoring_deadline() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    let mut out = harness::holder_paused(&h, &redis(&r), true);
    out.unsafe_demo = true;
    out.record(&report_dir());
    assert!(
        out.verdict
            .violations
            .iter()
            .any(|v| v.starts_with("overlap")),
        "the checker missed the unsafe holder's overlap: {out:?}"
    );
}

/// A resource that ignores fences accepts the paused holder's late write:
/// the checker must report a stale write, and the scenario must fail.
#[test]
fn checker_catches_resource_ignoring_fences() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = Harness::new(BIN, true).expect("harness");
    let mut out = harness::holder_paused(&h, &redis(&r), false);
    out.scenario = "unfenced-resource-sigstop".into();
    out.unsafe_demo = true;
    out.record(&report_dir());
    assert!(
        out.verdict
            .violations
            .iter()
            .any(|v| v.starts_with("stale write accepted")),
        "the checker missed the stale write: {out:?}"
    );
    assert!(!out.passed());
}

// ---- connection cut (proxy drops or stalls the holder's traffic) ----

#[test]
fn cut_stall_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    conclude(&harness::connection_cut(&h, &redis(&r), Mode::Stall));
}

#[test]
fn cut_drop_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    conclude(&harness::connection_cut(&h, &redis(&r), Mode::Drop));
}

#[test]
fn cut_stall_postgres() {
    let t = postgres_shared();
    let h = harness();
    conclude(&harness::connection_cut(&h, &t, Mode::Stall));
}

#[test]
fn cut_drop_postgres() {
    let t = postgres_shared();
    let h = harness();
    conclude(&harness::connection_cut(&h, &t, Mode::Drop));
}

#[test]
fn cut_stall_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = harness();
    conclude(&harness::connection_cut(&h, &etcd(&e), Mode::Stall));
}

#[test]
fn cut_drop_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = harness();
    conclude(&harness::connection_cut(&h, &etcd(&e), Mode::Drop));
}

// ---- slow store (latency on the proxy) ----

const LATENCY: Duration = Duration::from_millis(40);

#[test]
fn slow_redis() {
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    conclude(&harness::slow_store(&h, &redis(&r), LATENCY));
}

#[test]
fn slow_postgres() {
    let t = postgres_shared();
    let h = harness();
    conclude(&harness::slow_store(&h, &t, LATENCY));
}

#[test]
fn slow_etcd() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let h = harness();
    conclude(&harness::slow_store(&h, &etcd(&e), LATENCY));
}

// ---- store faults during contention ----

/// Redis without persistence loses every hold on a restart. The workers run
/// with the backend's restart quarantine set to the TTL, so no one is
/// granted the key for one TTL after its data was lost while the old
/// holder's renewals are refused. Without the quarantine a newcomer takes
/// the key while the old holder still believes it holds it (fences still
/// protect a fenced resource): see docs/RELIABILITY.md.
#[test]
fn restart_redis() {
    let mut r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    let mut t = redis(&r);
    t.url = r.url_with_quarantine(t.ttl);
    let mut out = harness::store_fault(&h, "store-restart", &t, || r.restart());
    out.note
        .push_str(&format!("; restart quarantine {} ms", t.ttl.as_millis()));
    if let Some(gap) = out.log.as_ref().and_then(lost_before_next_acquire) {
        out.note.push_str(&format!(
            "; lost() {} ms before the next acquire",
            gap / 1_000_000
        ));
    }
    conclude(&out);
}

/// Nanoseconds from the first `lost()` to the next acquisition after it.
fn lost_before_next_acquire(log: &moltlock_faults::service::Log) -> Option<u128> {
    let lost = log.events.iter().find(|e| e.kind == "lost")?;
    let next = log
        .events
        .iter()
        .filter(|e| e.kind == "acquired" && e.t > lost.t)
        .map(|e| e.t)
        .min()?;
    Some(next - lost.t)
}

#[test]
fn restart_postgres() {
    let mut pg =
        fixtures::postgres::start(&fixtures::postgres::PgOptions::default()).expect("postgres");
    let h = harness();
    let t = Target {
        backend: "postgres",
        url: pg.url.clone(),
        ttl: TTL,
    };
    conclude(&harness::store_fault(&h, "store-restart", &t, || {
        pg.server.as_mut().ok_or("no server")?.restart_with("INT")
    }));
}

#[test]
fn restart_etcd() {
    let mut e = fixtures::etcd::start_single().expect("etcd");
    let h = harness();
    let t = etcd(&e);
    conclude(&harness::store_fault(&h, "store-restart", &t, || {
        e.process.restart()
    }));
}

/// A three-member etcd cluster loses its leader (SIGKILL) while workers
/// that know every member contend.
#[test]
fn leader_kill_etcd_cluster() {
    let mut c = fixtures::etcd::EtcdCluster::start(3).expect("etcd cluster");
    let h = harness();
    let t = Target {
        backend: "etcd-3",
        url: format!("etcd://{}", c.endpoints().join(",")),
        ttl: ETCD_TTL,
    };
    conclude(&harness::store_fault(&h, "leader-kill", &t, || {
        c.kill_leader()?;
        c.wait_for_leader(Duration::from_secs(20)).map(drop)
    }));
}

// ---- a quorum member store killed and restarted ----

/// A quorum of three stores of different kinds: etcd, the shared Postgres
/// and a Redis of its own, without persistence and so with its restart
/// quarantine.
fn quorum_target(e: &fixtures::etcd::EtcdMember, r: &fixtures::redis::OwnedRedis) -> Target {
    let pg = fixtures::postgres::shared_url().expect("postgres");
    Target {
        backend: "quorum(etcd+postgres+redis)",
        url: format!(
            "quorum:etcd://{}|{pg}|{}",
            e.endpoint(),
            r.url_with_quarantine(ETCD_TTL)
        ),
        ttl: ETCD_TTL,
    }
}

/// How long a killed member stays down: past every hold's TTL, so holds
/// are taken, renewed and expire on the other two alone.
const MEMBER_DOWN: Duration = Duration::from_secs(7);

/// Runs the store-fault scenario on a quorum with `kill` taking one member
/// down for [`MEMBER_DOWN`] and `restart` bringing it back; a second into
/// the outage a newcomer process starts (its quorum connects with the
/// member down). Besides the scenario's own checks (0 violations, fences
/// rising across the fault), the workers must have taken the key while
/// the member was down, and the newcomer must have connected then.
fn member_down(
    h: &Harness,
    t: &Target,
    mut kill: impl FnMut(),
    mut restart: impl FnMut() -> Result<(), String>,
) -> Outcome {
    let window = std::cell::Cell::new((0, 0));
    let mut joiner = None;
    let mut out = harness::store_fault_on_key(h, "quorum-member-restart", t, |key| {
        let down = moltlock_faults::now_ns();
        kill();
        std::thread::sleep(Duration::from_secs(1));
        let mut spec = harness::Spec::new("joiner", t, key, 1, t.ttl.mul_f64(0.4));
        spec.retry = Some(Duration::from_millis(25));
        joiner = Some(h.spawn(&spec)?);
        std::thread::sleep(MEMBER_DOWN - Duration::from_secs(1));
        window.set((down, moltlock_faults::now_ns()));
        restart()
    });
    if let Some(mut w) = joiner {
        if let Err(e) = h.finish(std::slice::from_mut(&mut w), Duration::from_secs(30)) {
            out.failures.push(e);
        }
        let log = h.service.log();
        out.verdict = moltlock_faults::check::check(&log);
        out.log = Some(log);
    }
    let (down, up) = window.get();
    let during = |kind: &str, who: Option<&str>| {
        out.log.as_ref().map_or(0, |l| {
            l.events
                .iter()
                .filter(|e| e.kind == kind && e.t > down && e.t < up)
                .filter(|e| who.is_none_or(|w| e.worker == w))
                .count()
        })
    };
    let taken = during("acquired", None);
    let joined = during("connected", Some("joiner"));
    if taken == 0 {
        let seen = timeline(out.log.as_ref(), down);
        out.failures.push(format!(
            "nobody took the key while a member was down ({:.1} s); events from the outage on: {seen}",
            up.saturating_sub(down) as f64 / 1e9
        ));
    }
    if joined == 0 {
        out.failures
            .push("the newcomer could not connect while a member was down".into());
    }
    out.note
        .push_str(&format!("; {taken} acquisitions while the member was down"));
    if joined > 0 {
        out.note.push_str(", a newcomer connected meanwhile");
    }
    out
}

/// The events of `log` from `from` (wall ns) on, as `+ms worker kind
/// (note)`, so a failure shows what the workers did meanwhile.
fn timeline(log: Option<&moltlock_faults::service::Log>, from: u128) -> String {
    let Some(log) = log else {
        return "no log".into();
    };
    let lines: Vec<String> = log
        .events
        .iter()
        .filter(|e| e.t >= from)
        .map(|e| {
            let ms = e.t.saturating_sub(from) / 1_000_000;
            format!("+{ms}ms {} {} {}", e.worker, e.kind, e.note)
        })
        .collect();
    lines.join("; ")
}

/// The quorum's Redis member is killed while a worker holds the key,
/// stays down past the TTL (the workers carry on over the other two) and
/// comes back empty: 0 violations, fences rising across it.
#[test]
fn quorum_member_killed_and_restarted() {
    let e = fixtures::etcd::start_single().expect("etcd");
    let r = std::cell::RefCell::new(fixtures::redis::start_owned().expect("redis"));
    let h = harness();
    let t = quorum_target(&e, &r.borrow());
    let mut out = member_down(
        &h,
        &t,
        || r.borrow_mut().server.kill(),
        || r.borrow_mut().restart(),
    );
    out.note.push_str(&format!(
        "; Redis member down {} s, back without its data",
        MEMBER_DOWN.as_secs()
    ));
    conclude(&out);
}

/// The quorum's etcd member is killed and restarted the same way: it comes
/// back with its data (and its leases' remaining time).
#[test]
fn quorum_etcd_member_killed_and_restarted() {
    let e = std::cell::RefCell::new(fixtures::etcd::start_single().expect("etcd"));
    let r = fixtures::redis::start_owned().expect("redis");
    let h = harness();
    let t = quorum_target(&e.borrow(), &r);
    let mut out = member_down(
        &h,
        &t,
        || e.borrow_mut().process.kill(),
        || e.borrow_mut().process.restart(),
    );
    out.backend = "quorum(etcd+postgres+redis), etcd down".into();
    out.note.push_str(&format!(
        "; etcd member down {} s, back with its data",
        MEMBER_DOWN.as_secs()
    ));
    conclude(&out);
}

// ---- the store's wall clock steps forward ----

/// How far the clock steps: far past any hold's TTL.
const STEP: &str = "+10s";

/// Steps `clock` forward while a worker holds the key on `target`.
fn clock_step(h: &Harness, target: &Target, clock: &FakeClock) -> Outcome {
    let mut out = harness::store_fault(h, "store-clock-step", target, || clock.step(STEP));
    out.note.push_str(&format!("; clock stepped {STEP}"));
    out
}

/// Where expiry follows a wall clock, a forward step frees a held key at
/// once: the holder believes it holds until its next renewal is refused.
/// The scenario must show that window (the checker reports it) and that it
/// is no longer than a renewal interval (TTL/3) plus scheduling slack.
fn window_is_one_interval(mut out: Outcome) {
    out.unsafe_demo = true;
    let window_us = out
        .verdict
        .violations
        .iter()
        .filter_map(|v| {
            v.split(" µs in common")
                .next()?
                .rsplit('(')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max();
    out.note.push_str(&match window_us {
        Some(us) => format!("; two believed holders for up to {} ms", us / 1000),
        None => "; no overlap seen".to_owned(),
    });
    out.record(&report_dir());
    assert!(out.failures.is_empty(), "{}", out.explain());
    let bound = TTL / 3 + Duration::from_millis(400);
    if let Some(us) = window_us {
        assert!(
            Duration::from_micros(us) <= bound,
            "two holders for {us} µs, more than a renewal interval: {}",
            out.explain()
        );
    }
}

fn postgres_under(clock: &FakeClock) -> fixtures::postgres::Postgres {
    let opts = fixtures::postgres::PgOptions {
        clock_file: Some(clock.path()),
        ..Default::default()
    };
    fixtures::postgres::start(&opts).expect("postgres under a fake clock")
}

/// Observed expiry judges no hold by a wall clock: 0 violations.
#[test]
fn clock_step_postgres_observed() {
    let clock = FakeClock::new().expect("clock");
    let pg = postgres_under(&clock);
    let h = harness();
    let t = Target {
        backend: "postgres-observed",
        url: format!("{}?expiry=observed", pg.url),
        ttl: TTL,
    };
    conclude(&clock_step(&h, &t, &clock));
}

#[test]
fn clock_step_postgres_store_clock() {
    let clock = FakeClock::new().expect("clock");
    let pg = postgres_under(&clock);
    let h = harness();
    let t = Target {
        backend: "postgres",
        url: pg.url.clone(),
        ttl: TTL,
    };
    window_is_one_interval(clock_step(&h, &t, &clock));
}

/// SQLite's store clock is each client process's own: every worker runs
/// under the stepped clock, as every process of a machine does.
#[test]
fn clock_step_sqlite_observed() {
    let clock = FakeClock::new().expect("clock");
    let h = harness().with_worker_env(clock.env());
    let mut t = sqlite(&h);
    t.backend = "sqlite-observed";
    t.url.push_str("?expiry=observed");
    conclude(&clock_step(&h, &t, &clock));
}

#[test]
fn clock_step_sqlite_store_clock() {
    let clock = FakeClock::new().expect("clock");
    let h = harness().with_worker_env(clock.env());
    let t = sqlite(&h);
    window_is_one_interval(clock_step(&h, &t, &clock));
}
