//! What the dialects' batch acquisitions (`CasMulti`) share: the checks on
//! the keys, the order rows are written in, and the outcome built key by
//! key from the single acquisition's outcomes.

use std::collections::HashSet;

use moltlock_core::{CasOutcome, Error, Fence, Held, LockKey, MultiMode, MultiOutcome};

/// Refuses a key named twice: the contract asks for distinct keys, and a
/// statement that wrote one row twice would fail in the database.
pub(crate) fn check_distinct(keys: &[LockKey]) -> Result<(), Error> {
    let mut seen = HashSet::with_capacity(keys.len());
    match keys.iter().find(|k| !seen.insert(k.as_str())) {
        Some(twice) => Err(Error::invalid_key(
            twice.as_str(),
            "named twice in one multi-key acquisition",
        )),
        None => Ok(()),
    }
}

/// The outcome of a batch of one key, from that key's single acquisition.
pub(crate) fn of_one(outcome: CasOutcome) -> MultiOutcome {
    match outcome {
        CasOutcome::Acquired { fence } => MultiOutcome::Acquired(vec![(0, fence)]),
        CasOutcome::Held(held) => MultiOutcome::Held(vec![(0, held)]),
    }
}

/// The indexes of `keys` in the order a batch writes them: for `All`,
/// sorted by key, so two batches over common keys lock their rows in one
/// order and cannot deadlock; for `Any`, the order given, which decides
/// the key taken.
pub(crate) fn write_order(keys: &[LockKey], mode: MultiMode) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    if mode == MultiMode::All {
        order.sort_by(|&a, &b| keys[a].as_str().cmp(keys[b].as_str()));
    }
    order
}

/// A batch's outcome, gathered from the single acquisition's outcome of
/// each key it tried.
pub(crate) struct Tally {
    mode: MultiMode,
    taken: Vec<(usize, Fence)>,
    busy: Vec<(usize, Held)>,
}

impl Tally {
    pub(crate) fn new(mode: MultiMode) -> Self {
        Self {
            mode,
            taken: Vec::new(),
            busy: Vec::new(),
        }
    }

    /// Records what the attempt at key `i` came to; true once the batch is
    /// decided (`Any`: a key taken; `All`: a key busy).
    pub(crate) fn add(&mut self, i: usize, outcome: CasOutcome) -> bool {
        match outcome {
            CasOutcome::Acquired { fence } => self.taken.push((i, fence)),
            CasOutcome::Held(held) => self.busy.push((i, held)),
        }
        match self.mode {
            MultiMode::All => !self.busy.is_empty(),
            MultiMode::Any => !self.taken.is_empty(),
        }
    }

    /// Whether the batch took its keys (and so must commit).
    pub(crate) fn took(&self) -> bool {
        match self.mode {
            MultiMode::All => self.busy.is_empty(),
            MultiMode::Any => !self.taken.is_empty(),
        }
    }

    /// The outcome: the keys taken, or the busy keys seen.
    pub(crate) fn finish(self) -> MultiOutcome {
        match self.took() {
            true => {
                let mut taken = self.taken;
                taken.sort_by_key(|&(i, _)| i);
                MultiOutcome::Acquired(taken)
            }
            false => {
                let mut busy = self.busy;
                busy.sort_by_key(|(i, _)| *i);
                MultiOutcome::Held(busy)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<LockKey> {
        names.iter().filter_map(|n| LockKey::new(*n).ok()).collect()
    }

    #[test]
    fn all_writes_in_key_order_and_any_in_the_order_given() {
        let k = keys(&["c", "a", "b"]);
        assert_eq!(write_order(&k, MultiMode::All), vec![1, 2, 0]);
        assert_eq!(write_order(&k, MultiMode::Any), vec![0, 1, 2]);
    }

    #[test]
    fn a_key_named_twice_is_refused() {
        assert!(check_distinct(&keys(&["a", "b"])).is_ok());
        assert!(matches!(
            check_distinct(&keys(&["a", "b", "a"])),
            Err(Error::InvalidKey { .. })
        ));
    }

    #[test]
    fn all_is_decided_by_a_busy_key_and_any_by_a_taken_one() {
        let mut all = Tally::new(MultiMode::All);
        assert!(!all.add(2, CasOutcome::Acquired { fence: Fence(5) }));
        assert!(!all.add(0, CasOutcome::Acquired { fence: Fence(6) }));
        assert_eq!(
            all.finish(),
            MultiOutcome::Acquired(vec![(0, Fence(6)), (2, Fence(5))])
        );
        let mut all = Tally::new(MultiMode::All);
        assert!(!all.add(0, CasOutcome::Acquired { fence: Fence(5) }));
        assert!(all.add(1, CasOutcome::Held(Held::default())));
        assert_eq!(all.finish(), MultiOutcome::Held(vec![(1, Held::default())]));
        let mut any = Tally::new(MultiMode::Any);
        assert!(!any.add(0, CasOutcome::Held(Held::default())));
        assert!(any.add(1, CasOutcome::Acquired { fence: Fence(3) }));
        assert_eq!(any.finish(), MultiOutcome::Acquired(vec![(1, Fence(3))]));
    }
}
