//! What a quorum reports of its holds: the holder a majority of its
//! members agree on.

use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinSet;

use super::QuorumBackend;
use crate::{Backend, Error, HolderInfo, Inspect, LockKey};

/// How long an inspection waits for the members still to answer once a
/// majority has.
const LATE_ANSWER: Duration = Duration::from_millis(250);

/// The holder a majority of member answers agree on, with the largest of
/// their fences: the members that counted for the hold (a grant that landed
/// after the count is deleted, so only until then can it show here).
fn agreed(answers: Vec<HolderInfo>, need: usize) -> Option<HolderInfo> {
    let mut best: Option<(usize, HolderInfo)> = None;
    for a in &answers {
        let same: Vec<&HolderInfo> = answers.iter().filter(|b| b.holder == a.holder).collect();
        if same.len() >= need && best.as_ref().is_none_or(|(n, _)| same.len() > *n) {
            let mut info = a.clone();
            info.fence = same.iter().filter_map(|b| b.fence).max();
            info.expires_in = same.iter().filter_map(|b| b.expires_in).min();
            best = Some((same.len(), info));
        }
    }
    best.map(|(_, info)| info)
}

#[async_trait]
impl Inspect for QuorumBackend {
    /// The holder a majority of members report; returns as soon as the
    /// answers decide it.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let mut set = JoinSet::new();
        for m in &self.members {
            let (m, key) = (m.clone(), key.clone());
            set.spawn(async move {
                match m.inspector() {
                    Some(i) => i.inspect(&key).await,
                    None => Ok(None),
                }
            });
        }
        let need = self.majority();
        let (mut answers, mut free, mut failed) = (Vec::new(), 0, None);
        // Every answer counts (how many agree decides the fence), but once
        // a majority answered, a member that hangs is waited for briefly.
        let mut answered = 0;
        loop {
            let next = if answered >= need {
                match tokio::time::timeout(LATE_ANSWER, set.join_next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            } else {
                set.join_next().await
            };
            let Some(joined) = next else { break };
            answered += 1;
            match joined {
                Ok(Ok(Some(info))) => answers.push(info),
                Ok(Ok(None)) => free += 1,
                Ok(Err(e)) => failed = Some(e),
                Err(e) => failed = Some(Error::store("quorum", e.to_string(), true)),
            }
        }
        set.detach_all();
        let found = agreed(answers, need);
        match (found, failed) {
            (None, Some(e)) if free <= self.members.len() - need => Err(e),
            (found, _) => Ok(found),
        }
    }

    /// Every hold a majority of members report, sorted by key. Members are
    /// asked side by side; a member that fails, or is still silent a
    /// moment after a majority answered, is left out.
    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let mut set = JoinSet::new();
        for m in &self.members {
            let (m, prefix) = (m.clone(), prefix.to_owned());
            set.spawn(async move {
                match m.inspector() {
                    Some(i) => i.list(&prefix).await,
                    None => Ok(Vec::new()),
                }
            });
        }
        let need = self.majority();
        let (mut all, mut answered, mut failed) = (Vec::new(), 0, None);
        loop {
            let next = if answered >= need {
                match tokio::time::timeout(LATE_ANSWER, set.join_next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            } else {
                set.join_next().await
            };
            let Some(joined) = next else { break };
            match joined {
                Ok(Ok(holds)) => {
                    answered += 1;
                    all.extend(holds);
                }
                Ok(Err(e)) => failed = Some(e),
                Err(e) => failed = Some(Error::store("quorum", e.to_string(), true)),
            }
        }
        set.detach_all();
        if answered < need {
            return Err(
                failed.unwrap_or_else(|| Error::store("quorum", "no majority answered", true))
            );
        }
        let mut keys: Vec<String> = all.iter().map(|h: &HolderInfo| h.key.clone()).collect();
        keys.sort();
        keys.dedup();
        Ok(keys
            .into_iter()
            .filter_map(|k| agreed(all.iter().filter(|h| h.key == k).cloned().collect(), need))
            .collect())
    }
}
