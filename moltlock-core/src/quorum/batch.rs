//! What a quorum does to many holds, or to a hold's description, at once:
//! one request per member, counted per item.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{no_majority, QuorumBackend};
use crate::{Backend, Describe, Error, LockKey, RenewItem, RenewMany, Token};

/// Per item, how many members said yes and how many no.
struct Votes {
    yes: Vec<usize>,
    no: Vec<usize>,
    last_error: Option<Error>,
}

impl Votes {
    fn new(items: usize) -> Self {
        Self {
            yes: vec![0; items],
            no: vec![0; items],
            last_error: None,
        }
    }

    fn add(&mut self, answers: &[bool]) {
        for (i, yes) in answers.iter().enumerate() {
            if *yes {
                self.yes[i] += 1;
            } else {
                self.no[i] += 1;
            }
        }
    }

    /// Every item decided: yes from `need` members, or no from more than
    /// `spare`.
    fn decided(&self, need: usize, spare: usize) -> bool {
        self.yes
            .iter()
            .zip(&self.no)
            .all(|(y, n)| *y >= need || *n > spare)
    }

    /// Each item's answer, or an error (retried by the caller, taking
    /// nothing away) when one is not decided.
    fn outcome(self, need: usize, spare: usize) -> Result<Vec<bool>, Error> {
        if !self.decided(need, spare) {
            return Err(self.last_error.unwrap_or_else(no_majority));
        }
        Ok(self.yes.iter().map(|y| *y >= need).collect())
    }
}

impl QuorumBackend {
    /// Runs `each` on every member side by side and counts its per-item
    /// answers until every item is decided, the members are done, or
    /// `until`.
    async fn vote<F, Fut>(&self, items: usize, until: Instant, each: F) -> Result<Vec<bool>, Error>
    where
        F: Fn(Arc<dyn Backend>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<bool>, Error>> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for m in &self.members {
            set.spawn(each(m.clone()));
        }
        let (need, spare) = (self.majority(), self.members.len() - self.majority());
        let mut votes = Votes::new(items);
        while !votes.decided(need, spare) {
            let Ok(Some(joined)) = tokio::time::timeout_at(until, set.join_next()).await else {
                break;
            };
            match joined {
                Ok(Ok(answers)) if answers.len() == items => votes.add(&answers),
                Ok(Ok(_)) => {
                    votes.last_error = Some(Error::store(
                        "quorum",
                        "a member answered the wrong number of items",
                        true,
                    ));
                }
                Ok(Err(e)) => votes.last_error = Some(e),
                Err(e) => votes.last_error = Some(Error::store("quorum", e.to_string(), true)),
            }
        }
        set.detach_all();
        votes.outcome(need, spare)
    }
}

#[async_trait]
impl RenewMany for QuorumBackend {
    /// Every member renews the whole batch (in one request where it
    /// batches). An item is renewed when a majority renewed it within
    /// `ttl × (1 − drift)` of the send, and refused when more members
    /// refused it than a majority can spare; a batch with an item that is
    /// neither (members failing or silent) is an error, which the manager
    /// retries, and takes nothing away.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let Some(shortest) = items.iter().map(|i| i.ttl).min() else {
            return Ok(Vec::new());
        };
        let until = Instant::now() + shortest.mul_f64(1.0 - self.drift);
        let shared: Arc<[RenewItem]> = items.into();
        self.vote(items.len(), until, |m| {
            let items = shared.clone();
            async move {
                match m.renewer() {
                    Some(r) => r.renew_many(&items).await,
                    None => crate::forward::renew_each(&*m, &items).await,
                }
            }
        })
        .await
    }
}

#[async_trait]
impl Describe for QuorumBackend {
    /// Stores the description on every member; `true` when a majority of
    /// them hold the key for `owner` and stored it.
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        let until = Instant::now() + super::DESCRIBE_WAIT;
        let (key, owner, text) = (key.clone(), owner.clone(), text.to_owned());
        let stored = self
            .vote(1, until, |m| {
                let (key, owner, text) = (key.clone(), owner.clone(), text.clone());
                async move {
                    let describer = crate::forward::require(m.name(), m.describer(), "describe")?;
                    Ok(vec![describer.describe(&key, &owner, &text).await?])
                }
            })
            .await?;
        Ok(stored.first().copied().unwrap_or(false))
    }
}
