//! What a quorum reports of its holds: the holder a majority of its
//! members agree on.

use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinSet;

use super::{QuorumBackend, STRAGGLE};
use crate::{Backend, Error, HolderInfo, Inspect, LockKey, Token};

/// How long an inspection waits for the members still to answer once a
/// majority has.
const LATE_ANSWER: Duration = Duration::from_millis(250);

/// The holder a majority of member answers agree on, with the largest of
/// their fences: the members that counted for the hold (a grant that landed
/// after the count is deleted, so only until then can it show here).
fn agreed(answers: &[HolderInfo], need: usize) -> Option<HolderInfo> {
    let mut best: Option<(usize, HolderInfo)> = None;
    for a in answers {
        let same: Vec<&HolderInfo> = answers.iter().filter(|b| b.holder == a.holder).collect();
        if same.len() >= need && best.as_ref().is_none_or(|(n, _)| same.len() > *n) {
            let mut info = a.clone();
            info.fence = same.iter().filter_map(|b| b.fence).max();
            info.expires_in = same.iter().filter_map(|b| b.expires_in).min();
            info.description = described(&same);
            best = Some((same.len(), info));
        }
    }
    best.map(|(_, info)| info)
}

/// The description of a holder whose members answered `same`: the text
/// most of them report. A member that reports none has not stored it yet
/// (a description is stored after the hold, and returns once a majority
/// stored it), so it does not outvote one that has.
fn described(same: &[&HolderInfo]) -> Option<String> {
    let texts: Vec<&String> = same.iter().filter_map(|b| b.description.as_ref()).collect();
    texts
        .iter()
        .max_by_key(|t| texts.iter().filter(|u| u == t).count())
        .map(|t| (*t).clone())
}

/// Every member's answer to `ask`, side by side: all of them, except that
/// once a majority answered, a member still silent after [`LATE_ANSWER`]
/// is left out.
async fn gather<T, F, Fut>(q: &QuorumBackend, ask: F) -> Vec<Result<T, Error>>
where
    T: Send + 'static,
    F: Fn(std::sync::Arc<dyn Backend>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>> + Send + 'static,
{
    let mut set = JoinSet::new();
    for m in &q.members {
        set.spawn(ask(m.clone()));
    }
    let need = q.majority();
    let mut answers = Vec::new();
    loop {
        let next = if answers.len() >= need {
            match tokio::time::timeout(LATE_ANSWER, set.join_next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        } else {
            set.join_next().await
        };
        let Some(joined) = next else { break };
        answers.push(joined.unwrap_or_else(|e| Err(Error::store("quorum", e.to_string(), true))));
    }
    set.detach_all();
    answers
}

/// `info` as seen `since` ago: its time left is that much shorter.
fn aged(mut info: HolderInfo, since: Duration) -> HolderInfo {
    info.expires_in = info.expires_in.map(|e| e.saturating_sub(since));
    info
}

/// How long after an inspection found a holder that not every member
/// reports it looks again: past the time a won acquisition still counts
/// stragglers ([`STRAGGLE`]), with a margin for its replies in flight.
const SETTLE: Duration = STRAGGLE.saturating_add(Duration::from_millis(50));

/// One look at every member: the holder a majority agree on, how many
/// members reported it, and whether a member that answered reported none
/// or another (so an acquisition may still be counting its grant).
struct Look {
    found: Result<Option<HolderInfo>, Error>,
    agreeing: usize,
    doubt: bool,
    /// The holders the members that answered reported, and how many
    /// reported the key free.
    answers: Vec<HolderInfo>,
    free: usize,
}

impl Look {
    /// How many members that answered deny `holder` the key: they report
    /// it free or held by another.
    fn denying(&self, holder: &Token) -> usize {
        self.free + self.answers.iter().filter(|a| &a.holder != holder).count()
    }
}

impl QuorumBackend {
    /// Asks every member for the holder of `key`.
    async fn look(&self, key: &LockKey) -> Look {
        let key = key.clone();
        let replies = gather(self, |m| {
            let key = key.clone();
            async move {
                match m.inspector() {
                    Some(i) => i.inspect(&key).await,
                    None => Ok(None),
                }
            }
        })
        .await;
        // Every answer counts (how many agree decides the fence).
        let need = self.majority();
        let (mut answers, mut free, mut failed) = (Vec::new(), 0, None);
        for reply in replies {
            match reply {
                Ok(Some(info)) => answers.push(info),
                Ok(None) => free += 1,
                Err(e) => failed = Some(e),
            }
        }
        let found = agreed(&answers, need);
        let agreeing = found.as_ref().map_or(0, |f| {
            answers.iter().filter(|a| a.holder == f.holder).count()
        });
        let doubt = found.is_some() && (free > 0 || agreeing < answers.len());
        let found = match (found, failed) {
            (None, Some(e)) if free <= self.members.len() - need => Err(e),
            (found, _) => Ok(found),
        };
        Look {
            found,
            agreeing,
            doubt,
            answers,
            free,
        }
    }
}

#[async_trait]
impl Inspect for QuorumBackend {
    /// The holder a majority of members report, with the fence its
    /// acquisition was given: when a member that answered reports no holder
    /// or another (an acquisition may still be counting a straggler's
    /// grant), it looks again after `SETTLE`. A member down or silent
    /// does not make it wait. A second look that hears no majority, while
    /// too few of the members that answered deny the first look's holder
    /// for it to have lost its majority, reports the first look's hold.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let asked = tokio::time::Instant::now();
        let first = self.look(key).await;
        let before = match first.found {
            Ok(Some(before)) if first.doubt => before,
            found => return found,
        };
        tokio::time::sleep(SETTLE).await;
        let again = self.look(key).await;
        // Too few members deny the holder for it to have lost its majority:
        // the rest are only silent or failing (down or slow), and a hold
        // stands until released or expired.
        let stands = again.denying(&before.holder) <= self.members.len() - self.majority();
        match again.found {
            // The same hold: the look that heard more of its members tells
            // its fence (a grant seen first may have been undone since).
            Ok(Some(mut now)) if now.holder == before.holder => {
                if again.agreeing < first.agreeing {
                    now.fence = now.fence.max(before.fence);
                }
                Ok(Some(now))
            }
            // No majority the second time: the first look's hold, its time
            // left counted from before that look was sent.
            Ok(None) | Err(_) if stands => Ok(Some(aged(before, asked.elapsed()))),
            now => now,
        }
    }

    /// Every hold a majority of members report, sorted by key. Members are
    /// asked side by side; a member that fails, or is still silent a
    /// moment after a majority answered, is left out (it needs a majority
    /// of answers).
    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let prefix = prefix.to_owned();
        let replies = gather(self, |m| {
            let prefix = prefix.clone();
            async move {
                match m.inspector() {
                    Some(i) => i.list(&prefix).await,
                    None => Ok(Vec::new()),
                }
            }
        })
        .await;
        let need = self.majority();
        let (mut all, mut answered, mut failed) = (Vec::new(), 0, None);
        for reply in replies {
            match reply {
                Ok(holds) => {
                    answered += 1;
                    all.extend(holds);
                }
                Err(e) => failed = Some(e),
            }
        }
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
            .filter_map(|k| {
                let same: Vec<HolderInfo> = all.iter().filter(|h| h.key == k).cloned().collect();
                agreed(&same, need)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Fence, Token};

    fn answer(holder: &Token, description: Option<&str>) -> HolderInfo {
        HolderInfo {
            key: "k".into(),
            holder: holder.clone(),
            fence: Some(Fence(1)),
            expires_in: Some(Duration::from_secs(5)),
            description: description.map(str::to_owned),
        }
    }

    /// A member that has not stored the description yet, answering first,
    /// does not hide the one the others stored.
    #[test]
    fn a_member_without_the_description_does_not_hide_it() {
        let t = Token::random();
        let answers = vec![
            answer(&t, None),
            answer(&t, Some("second")),
            answer(&t, Some("second")),
        ];
        let found = agreed(&answers, 2).unwrap();
        assert_eq!(found.description.as_deref(), Some("second"));
        let answers = vec![answer(&t, None), answer(&t, Some("second"))];
        assert_eq!(
            agreed(&answers, 2).unwrap().description.as_deref(),
            Some("second")
        );
        let answers = vec![answer(&t, None), answer(&t, None)];
        assert_eq!(agreed(&answers, 2).unwrap().description, None);
    }
}
