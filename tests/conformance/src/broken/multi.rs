//! The flawed store's `cas_multi`: sound under one lock of the store, or
//! with one of the multi-key flaws.

use moltlock_core::{CasMulti, MultiMode, MultiOutcome};

use super::*;

impl Flawed {
    /// What `cas(key, None, …)` would see of a held key, or `None` when free.
    fn busy(&self, st: &Store, key: &LockKey, now: Instant) -> Option<Held> {
        let e = st
            .entries
            .get(&self.norm(key.as_str()))
            .filter(|e| self.alive(e, now))?;
        Some(Held {
            holder: Some(e.holder.clone()),
            expires_in: Some(e.expires_at.saturating_duration_since(now)),
            revision: None,
        })
    }

    /// Takes a free key (the caller checked) with a fresh fence.
    fn take(&self, st: &mut Store, key: &LockKey, token: &Token, ttl: Duration) -> Fence {
        match self.cas_now(st, key.as_str(), None, token, ttl, None, None) {
            CasOutcome::Acquired { fence } => fence,
            CasOutcome::Held(_) => Fence(0),
        }
    }

    /// One key at a time with a pause between (a flaw), giving back what
    /// it took when a key is held.
    async fn in_turn(&self, keys: &[LockKey], token: &Token, ttl: Duration) -> MultiOutcome {
        let mut taken = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let busy = self.busy(&self.store(), key, Instant::now());
            if let Some(held) = busy {
                let mut st = self.store();
                for (j, _) in &taken {
                    let k: &LockKey = &keys[*j];
                    st.entries.remove(&self.norm(k.as_str()));
                }
                return MultiOutcome::Held(vec![(i, held)]);
            }
            taken.push((i, self.take(&mut self.store(), key, token, ttl)));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        MultiOutcome::Acquired(taken)
    }
}

#[async_trait]
impl CasMulti for Flawed {
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        if mode == MultiMode::All && self.has(Flaw::MultiTakesInTurn) {
            return Ok(self.in_turn(keys, token, ttl).await);
        }
        let now = Instant::now();
        let mut st = self.store();
        let mut busy = Vec::new();
        let mut taken = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.busy(&st, key, now) {
                Some(held) => {
                    busy.push((i, held));
                    if mode == MultiMode::All && self.has(Flaw::MultiLeavesPartial) {
                        return Ok(MultiOutcome::Held(busy));
                    }
                }
                None if mode == MultiMode::All && !self.has(Flaw::MultiLeavesPartial) => {}
                None => {
                    taken.push((i, self.take(&mut st, key, token, ttl)));
                    if mode == MultiMode::Any && !self.has(Flaw::MultiAnyTakesSeveral) {
                        return Ok(MultiOutcome::Acquired(taken));
                    }
                }
            }
        }
        if mode == MultiMode::Any {
            return Ok(match taken.first() {
                Some(first) => MultiOutcome::Acquired(vec![*first]),
                None => MultiOutcome::Held(busy),
            });
        }
        if !busy.is_empty() {
            return Ok(MultiOutcome::Held(busy));
        }
        if taken.is_empty() {
            for (i, key) in keys.iter().enumerate() {
                taken.push((i, self.take(&mut st, key, token, ttl)));
            }
        }
        Ok(MultiOutcome::Acquired(taken))
    }
}
