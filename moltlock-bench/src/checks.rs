//! The targets a run's figures are checked against (issue targets: ratios
//! to the floor, hand-off in round trips, tails against the best peer).

use crate::report::{ms, BackendReport, Check, PeerReport, Report};
use crate::stats::ratio;
use crate::workload::ContendedResult;

impl Report {
    /// Fills [`Report::checks`] from the measurements.
    pub fn check(&mut self) {
        let mut out = Vec::new();
        let throughput = self.settings.measured("throughput");
        for b in self.backends.iter().filter(|b| b.error.is_none()) {
            if throughput {
                check_throughput(b, &mut out);
            }
            check_backend(b, &self.peers, &mut out);
            check_against_peers(b, &self.peers, throughput, &mut out);
        }
        self.checks = out;
    }
}

fn push(out: &mut Vec<Check>, what: String, value: String, met: bool) {
    out.push(Check { what, value, met });
}

fn check_throughput(b: &BackendReport, out: &mut Vec<Check>) {
    let st = &b.store;
    push(
        out,
        format!("{st}: uncontended ≥ 0.9 × floor"),
        format!("{:.2} ×", b.uncontended_ratio),
        b.uncontended_ratio >= 0.9,
    );
    push(
        out,
        format!("{st}: parallel ≥ 0.8 × floor"),
        format!("{:.2} ×", b.parallel_ratio),
        b.parallel_ratio >= 0.8,
    );
    if let Some(x) = b.fair_ratio() {
        push(
            out,
            format!("{st} fair: uncontended ≥ 0.8 × floor"),
            format!("{x:.2} ×"),
            x >= 0.8,
        );
    }
}

/// The peer named `prefix…` on `store`, if it ran.
fn peer<'a>(peers: &'a [PeerReport], store: &str, prefix: &str) -> Option<&'a PeerReport> {
    peers
        .iter()
        .find(|p| p.store == store && p.name.starts_with(prefix) && p.error.is_none())
}

/// The targets set against a peer: Redis at least rslock's single-task
/// cycles (both to the floor of their store), etcd's fair queue at least
/// five times the Lock RPC's contended acquisitions with a hand-off p99 of
/// at most 10 ms.
fn check_against_peers(
    b: &BackendReport,
    peers: &[PeerReport],
    throughput: bool,
    out: &mut Vec<Check>,
) {
    let st = &b.store;
    if let (true, Some(rs)) = (throughput, peer(peers, st, "rslock")) {
        push(
            out,
            format!("{st}: uncontended ≥ rslock's (each ÷ the floor)"),
            format!(
                "{:.2} × against {:.2} ×",
                b.uncontended_ratio, rs.uncontended_ratio
            ),
            b.uncontended_ratio >= rs.uncontended_ratio,
        );
    }
    let rpc = peer(peers, st, "etcd Lock RPC").and_then(|p| p.contended.as_ref());
    // Either run without a hand-off has nothing to compare.
    let ran = |c: &&ContendedResult| c.per_sec > 0.0 && c.handoff.count > 0;
    if let (Some(fair), Some(rpc)) = (b.contended_fair.as_ref().filter(ran), rpc.filter(ran)) {
        let x = ratio(fair.per_sec, rpc.per_sec);
        push(
            out,
            format!("{st} fair: ≥ 5 × the Lock RPC's acquisitions/s, hand-off p99 ≤ 10 ms"),
            format!(
                "{:.0} /s = {x:.1} × {:.0} /s; p99 {:.1} ms",
                fair.per_sec,
                rpc.per_sec,
                ms(fair.handoff.p99_us)
            ),
            x >= 5.0 && fair.handoff.p99_us <= 10_000.0,
        );
    }
}

fn check_backend(b: &BackendReport, peers: &[PeerReport], out: &mut Vec<Check>) {
    let st = &b.store;
    let handoff_stores = ["redis", "etcd", "postgres"];
    let modes = [
        ("default", &b.contended),
        ("shared", &b.contended_shared),
        ("fair", &b.contended_fair),
    ];
    for (mode, c) in modes {
        let Some(c) = c else { continue };
        push(
            out,
            format!("{st} {mode}: no overlap"),
            format!("{} overlaps", c.overlaps),
            c.overlaps == 0,
        );
        push(
            out,
            format!("{st} {mode}: fences rise on every hand-off"),
            format!("{} went back", c.fence_backwards),
            c.fence_backwards == 0,
        );
        if let ("shared", true, Some(r)) = (
            mode,
            st == "redis" || st == "etcd",
            c.requests_per_acquisition,
        ) {
            push(
                out,
                format!("{st} shared: ≤ 2.5 store requests per acquisition"),
                format!("{r:.2} per acquisition"),
                r <= 2.5,
            );
        }
        // The least-served task gets at least a quarter of a fair share.
        let floor_share = 0.25 / c.tasks.max(1) as f64;
        push(
            out,
            format!("{st} {mode}: no task starves (least served ≥ ¼ of a fair share)"),
            format!(
                "{} timeouts; smallest share {:.1} % (≥ {:.1} %); longest wait {:.0} ms",
                c.timeouts,
                c.min_task_share * 100.0,
                floor_share * 100.0,
                ms(c.max_wait_us)
            ),
            c.timeouts == 0 && c.min_task_share >= floor_share,
        );
        if mode == "fair" {
            push(
                out,
                format!("{st} fair: the releaser never jumps the queue"),
                format!("releaser won {:.1} %", c.releaser_won * 100.0),
                c.releaser_won == 0.0,
            );
        }
        if !handoff_stores.contains(&st.as_str()) {
            continue;
        }
        let x = ratio(c.handoff.p50_us, b.rtt.p50_us);
        push(
            out,
            format!("{st} {mode}: hand-off p50 ≤ 3 × RTT"),
            format!(
                "{:.0} µs = {x:.1} × RTT {:.0} µs",
                c.handoff.p50_us, b.rtt.p50_us
            ),
            x <= 3.0,
        );
        let rs = peers
            .iter()
            .find(|p| p.name.starts_with("rslock"))
            .and_then(|p| p.contended.as_ref());
        if let Some(rs) = rs {
            let lower = ratio(rs.handoff.p99_us, c.handoff.p99_us);
            push(
                out,
                format!("{st} {mode}: hand-off p99 ≥ 3 × lower than rslock's"),
                format!(
                    "{:.0} µs vs rslock {:.0} µs: {lower:.1} × lower",
                    c.handoff.p99_us, rs.handoff.p99_us
                ),
                lower >= 3.0,
            );
        }
    }
    if let Some(r) = &b.renewal {
        push(
            out,
            format!("{st}: one renewal round trip per interval"),
            format!("{:.1} per interval", r.rounds_per_interval),
            r.rounds_per_interval <= 1.0 && r.lost == 0,
        );
        push(
            out,
            format!("{st}: < 2 KiB client memory per held lock"),
            format!("{:.0} bytes", r.bytes_per_lock),
            r.bytes_per_lock < 2048.0,
        );
    }
}
