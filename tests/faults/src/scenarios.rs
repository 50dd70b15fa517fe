//! The scenarios: each starts workers on one key, injects one fault at
//! the worst moment, and returns what the checker found.
//!
//! Scenario functions are synchronous and meant to be called from a test's
//! own thread: servers the test starts (and restarts inside a scenario's
//! fault closure) then live as long as that thread, which is what the
//! fixtures' parent-death signal needs.

use std::time::Duration;

use moltlock_fixtures::signal;

use crate::check::check;
use crate::now_ns;
use crate::proxy::Mode;
use crate::report::Outcome;
use crate::service::Event;
use crate::workers::{host_port, key, via, Harness, Spec, Target, HANDOFF};

/// Allowance for one hand-off on a busy two-core machine: waking a waiter,
/// its acquire round trip, process scheduling.
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
    let _forget = moltlock_fixtures::rows::Forget::new(&target.url, &key);
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
    let _forget = moltlock_fixtures::rows::Forget::new(&target.url, &key);
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
    let _forget = moltlock_fixtures::rows::Forget::new(&target.url, &key);
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
    let _forget = moltlock_fixtures::rows::Forget::new(&target.url, &key);
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
    store_fault_on_key(h, scenario, target, |_| fault())
}

/// [`store_fault`] with a fault that is told the scenario's key (to start
/// workers of its own on it while the fault lasts).
pub fn store_fault_on_key(
    h: &Harness,
    scenario: &str,
    target: &Target,
    fault: impl FnOnce(&str) -> Result<(), String>,
) -> Outcome {
    let mut out = Outcome::new(scenario, target);
    let key = key(scenario);
    let _forget = moltlock_fixtures::rows::Forget::new(&target.url, &key);
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
    if let Err(e) = fault(&key) {
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
