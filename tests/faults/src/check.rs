//! The checker: what counts as a violation of the lock contract in a log.

use std::collections::HashMap;

use crate::service::Log;

/// What the checker found in one log.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Acquisitions reported (`acquired` events).
    pub acquisitions: usize,
    /// Critical sections reported.
    pub sections: usize,
    /// Sections whose hold was valid throughout.
    pub valid_sections: usize,
    /// Writes the fenced resource refused.
    pub refused_writes: usize,
    /// Every violation, described.
    pub violations: Vec<String>,
}

impl Verdict {
    /// Whether no violation was found.
    pub fn clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks a log:
///
/// 1. **overlap** — two sections of different holds, both valid throughout,
///    whose spans intersect: two holders believed they held the key at once;
/// 2. **belief overlap** — two sections of different holds during which
///    both workers saw `is_held()` true at overlapping times (from each
///    section's start to the last instant its worker saw the hold valid):
///    two holders believed at once, even if one found out before its end;
/// 3. **stale write accepted** — the resource accepted a write whose fence
///    was lower than one it had accepted before;
/// 4. **duplicate fence** — two acquisitions returned the same fence.
pub fn check(log: &Log) -> Verdict {
    let mut v = Verdict {
        acquisitions: log.events.iter().filter(|e| e.kind == "acquired").count(),
        sections: log.sections.len(),
        valid_sections: log.sections.iter().filter(|s| s.report.valid).count(),
        refused_writes: log.writes.iter().filter(|w| !w.accepted).count(),
        violations: Vec::new(),
    };
    let mut valid: Vec<_> = log.sections.iter().filter(|s| s.report.valid).collect();
    valid.sort_by_key(|s| s.report.start);
    for (i, a) in valid.iter().enumerate() {
        for b in valid.iter().skip(i + 1) {
            if b.report.start >= a.report.end {
                break;
            }
            if a.worker != b.worker || a.report.fence != b.report.fence {
                v.violations.push(format!(
                    "overlap: {} (fence {}) held [{}, {}] while {} (fence {}) held [{}, {}] \
                     ({} µs in common), both valid",
                    a.worker,
                    a.report.fence,
                    a.report.start,
                    a.report.end,
                    b.worker,
                    b.report.fence,
                    b.report.start,
                    b.report.end,
                    (a.report.end.min(b.report.end) - b.report.start) / 1000
                ));
            }
        }
    }
    let mut believed: Vec<_> = log
        .sections
        .iter()
        .filter(|s| !s.report.valid && s.report.last_held > s.report.start)
        .chain(valid.iter().copied())
        .collect();
    believed.sort_by_key(|s| s.report.start);
    for (i, a) in believed.iter().enumerate() {
        for b in believed.iter().skip(i + 1) {
            if b.report.start >= a.report.last_held {
                continue;
            }
            if (a.report.valid && b.report.valid)
                || (a.worker == b.worker && a.report.fence == b.report.fence)
            {
                continue; // already reported above, or the same hold
            }
            if b.report.start < a.report.last_held && a.report.start < b.report.last_held {
                v.violations.push(format!(
                    "belief overlap: {} (fence {}) saw its hold valid until {} while {} \
                     (fence {}) held from {} ({} µs in common)",
                    a.worker,
                    a.report.fence,
                    a.report.last_held,
                    b.worker,
                    b.report.fence,
                    b.report.start,
                    (a.report.last_held.min(b.report.last_held) - b.report.start) / 1000
                ));
            }
        }
    }
    let mut highest: Option<(u64, &str)> = None;
    for w in log.writes.iter().filter(|w| w.accepted) {
        if let Some((h, by)) = highest {
            if w.fence < h {
                v.violations.push(format!(
                    "stale write accepted: {} wrote with fence {} after {} had written with fence {h}",
                    w.worker, w.fence, by
                ));
                continue;
            }
        }
        if highest.is_none_or(|(h, _)| w.fence >= h) {
            highest = Some((w.fence, &w.worker));
        }
    }
    let mut owner: HashMap<u64, &str> = HashMap::new();
    for e in log.events.iter().filter(|e| e.kind == "acquired") {
        match owner.get(&e.fence) {
            Some(w) => v.violations.push(format!(
                "duplicate fence: {} and {} both acquired with fence {}",
                w, e.worker, e.fence
            )),
            None => {
                owner.insert(e.fence, &e.worker);
            }
        }
    }
    v
}
