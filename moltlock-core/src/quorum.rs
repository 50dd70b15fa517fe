//! A lock over N stores, of any kinds: held when a majority of them hold it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinSet;
use tokio::time::Instant;

mod batch;
mod inspect;
mod late;

pub use late::{ConnectMember, LateMember};

use crate::clock::StepListener;
use crate::{
    Backend, CasOutcome, Describe, Error, Fence, Held, Inspect, Limits, LockKey, RaiseFence,
    RenewMany, StoreClock, Token,
};

/// How long a won acquisition waits for the members still answering, and
/// a request that a majority answered waits for members known to fail.
const STRAGGLE: Duration = Duration::from_millis(100);

/// How long a description waits for the members' answers.
const DESCRIBE_WAIT: Duration = Duration::from_secs(5);

/// The drift allowance a quorum grants before it stops counting replies.
const DEFAULT_DRIFT: f64 = 0.02;

/// A [`Backend`] over N member stores (etcd, Postgres, Redis, … mixed): a
/// request holds the key when a majority of members granted it within
/// `ttl × (1 − drift)` of the send; otherwise whatever it took, and whatever
/// lands late, is deleted by its token. Fences are the largest of the
/// majority's, and every member of that majority raises its fence minimum
/// to it before the request returns, so any later majority (which shares a
/// member with this one) gives a larger fence.
///
/// The manager and every primitive run over it unchanged. What a quorum
/// buys: locks stay available while a minority of the stores is down or cut
/// off. What it does not: it is no safer than its fences — a paused holder
/// can still write after its lease ended (the critique of Redlock), so pass
/// the fence to the resource. A Redis member without persistence must run
/// with its restart quarantine, or a restart can hand out a key a majority
/// still holds.
#[derive(Clone)]
pub struct QuorumBackend {
    members: Vec<Arc<dyn Backend>>,
    drift: f64,
    /// Every member's clock steps, passed on: a step of any one member's
    /// clock may expire a hold there early.
    clock: Arc<StoreClock>,
    /// The listeners on the members' clocks (held, as clocks keep weak ones).
    _relays: Vec<Arc<StepListener>>,
    /// Per member: its last reply to a `cas` (an acquisition, or a single
    /// renewal) that was counted or drained was an error (it is down or
    /// cut off). Once a majority answered, a request waits for such a
    /// member only [`STRAGGLE`] more: a dead member answers only after its
    /// client's reconnect attempts, and contenders whose votes split over
    /// the live ones would each wait that long, round after round.
    failing: Arc<[AtomicBool]>,
}

impl std::fmt::Debug for QuorumBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.members.iter().map(|m| m.name()).collect();
        f.debug_struct("QuorumBackend")
            .field("members", &names)
            .field("drift", &self.drift)
            .finish()
    }
}

/// What one member answered, by its index.
type Reply = (usize, Result<CasOutcome, Error>);

impl QuorumBackend {
    /// A quorum over `members` (at least one; an odd count makes the most of
    /// them). Every member must raise fences ([`Backend::fence_raiser`]) and
    /// inspect holds ([`Backend::inspector`]). A member that picks the next
    /// holder by itself ([`Backend::turns`]) has that turned off.
    ///
    /// # Errors
    /// [`Error::Config`] for no members, or a member without those.
    pub fn new(members: impl IntoIterator<Item = Arc<dyn Backend>>) -> Result<Self, Error> {
        let members: Vec<_> = members.into_iter().collect();
        if members.is_empty() {
            return Err(Error::Config("a quorum needs at least one member".into()));
        }
        for m in &members {
            if m.fence_raiser().is_none() || m.inspector().is_none() {
                return Err(Error::Config(format!(
                    "quorum member {} cannot raise fences and inspect holds, which a quorum needs",
                    m.name()
                )));
            }
        }
        // A member that picked the next holder by itself would split the
        // votes: each member would keep the key for a different client.
        for turns in members.iter().filter_map(|m| m.turns()) {
            turns.set_turns(false);
        }
        let clock = Arc::new(StoreClock::new());
        let relays = members
            .iter()
            .filter_map(|m| m.store_clock())
            .map(|member_clock| StoreClock::relay(&clock, member_clock))
            .collect();
        let failing = members.iter().map(|_| AtomicBool::new(false)).collect();
        Ok(Self {
            members,
            drift: DEFAULT_DRIFT,
            clock,
            _relays: relays,
            failing,
        })
    }

    /// The clock-drift allowance: replies count only until
    /// `ttl × (1 − drift)` after the send. Clamped to 0..=0.5.
    pub fn drift(mut self, drift: f64) -> Self {
        self.drift = if drift.is_finite() {
            drift.clamp(0.0, 0.5)
        } else {
            DEFAULT_DRIFT
        };
        self
    }

    /// The member stores.
    pub fn members(&self) -> &[Arc<dyn Backend>] {
        &self.members
    }

    /// How many members make a majority.
    pub fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }

    /// Sends `cas` to every member, each in a task of its own (a reply that
    /// comes after the decision is still seen, by the cleanup).
    fn send_all(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> JoinSet<Reply> {
        let mut set = JoinSet::new();
        for (i, member) in self.members.iter().enumerate() {
            let (member, key, new) = (member.clone(), key.clone(), new.clone());
            let expected = expected.cloned();
            set.spawn(async move { (i, member.cas(&key, expected.as_ref(), &new, ttl).await) });
        }
        set
    }

    /// Counts replies until a majority granted, a majority can no longer
    /// grant, or the counting time is over.
    ///
    /// Once a majority granted, the members still answering get
    /// [`STRAGGLE`] more (within `until`) when `straggle` is set: what they
    /// grant counts too, so the hold lives on more than a bare majority.
    /// Once a majority answered and only failing members are left, they
    /// get [`STRAGGLE`] more too.
    async fn count(&self, set: &mut JoinSet<Reply>, until: Instant, straggle: bool) -> Tally {
        let mut tally = Tally::default();
        let need = self.majority();
        let mut until = until;
        let mut answered = vec![false; self.members.len()];
        loop {
            let won = tally.granted.len() >= need;
            if (won && !straggle) || self.members.len() - tally.refusals() < need {
                break;
            }
            if (won || self.only_failing_left(&answered)) && until > Instant::now() + STRAGGLE {
                until = Instant::now() + STRAGGLE;
            }
            let Ok(Some(joined)) = tokio::time::timeout_at(until, set.join_next()).await else {
                break;
            };
            if let Ok((i, reply)) = &joined {
                note_reply(&self.failing, *i, reply);
                if let Some(seen) = answered.get_mut(*i) {
                    *seen = true;
                }
            }
            match joined {
                Ok((i, Ok(CasOutcome::Acquired { fence }))) => tally.granted.push((i, fence)),
                Ok((_, Ok(CasOutcome::Held(held)))) => tally.held.push(held),
                Ok((_, Err(e))) => tally.errors.push(e),
                Err(e) => tally
                    .errors
                    .push(Error::store("quorum", e.to_string(), true)),
            }
        }
        tally
    }

    /// Whether a majority `answered` and every member yet to answer is
    /// failing.
    fn only_failing_left(&self, answered: &[bool]) -> bool {
        let heard = answered.iter().filter(|a| **a).count();
        heard >= self.majority()
            && answered
                .iter()
                .zip(self.failing.iter())
                .all(|(a, f)| *a || f.load(Ordering::Relaxed))
    }

    /// Deletes by `token`, in the background, what the granting members
    /// took and what lands late.
    fn undo(&self, key: &LockKey, token: &Token, granted: &[(usize, Fence)], set: JoinSet<Reply>) {
        let members = self.members.clone();
        let failing = self.failing.clone();
        let taken: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
        let (key, token) = (key.clone(), token.clone());
        let mut set = set;
        tokio::spawn(async move {
            let mut undone = JoinSet::new();
            for i in taken {
                if let Some(m) = members.get(i).cloned() {
                    let (key, token) = (key.clone(), token.clone());
                    undone.spawn(async move { m.delete(&key, &token).await });
                }
            }
            while let Some(joined) = set.join_next().await {
                if let Ok((i, reply)) = &joined {
                    note_reply(&failing, *i, reply);
                }
                if let Ok((i, Ok(CasOutcome::Acquired { .. }))) = joined {
                    if let Some(m) = members.get(i) {
                        let _ = m.delete(&key, &token).await;
                    }
                }
            }
            while undone.join_next().await.is_some() {}
        });
    }

    /// Raises the fence minimum of the members at `indices` to `fence`;
    /// done once `need` of them did (the rest go on in the background).
    async fn raise_on(
        &self,
        key: &LockKey,
        indices: &[usize],
        fence: Fence,
        need: usize,
    ) -> Result<(), Error> {
        let mut set = JoinSet::new();
        for i in indices {
            let Some(m) = self.members.get(*i).cloned() else {
                continue;
            };
            let key = key.clone();
            set.spawn(async move {
                match m.fence_raiser() {
                    Some(r) => r.raise_fence(&key, fence).await,
                    None => Err(Error::Unsupported {
                        backend: m.name(),
                        what: "raise fence",
                    }),
                }
            });
        }
        let (mut done, mut last) = (0, None);
        while done < need {
            let Some(joined) = set.join_next().await else {
                break;
            };
            match joined {
                Ok(Ok(())) => done += 1,
                Ok(Err(e)) => last = Some(e),
                Err(e) => last = Some(Error::store("quorum", e.to_string(), true)),
            }
        }
        set.detach_all();
        match last {
            Some(e) if done < need => Err(e),
            _ => Ok(()),
        }
    }
}

/// Marks member `i` of `failing` when `reply` is an error, else clears it.
fn note_reply(failing: &[AtomicBool], i: usize, reply: &Result<CasOutcome, Error>) {
    if let Some(flag) = failing.get(i) {
        flag.store(reply.is_err(), Ordering::Relaxed);
    }
}

/// No majority of the members answered in time.
fn no_majority() -> Error {
    Error::Unavailable {
        backend: "quorum",
        message: "no majority of the members answered in time".into(),
        source: None,
    }
}

/// The replies counted so far.
#[derive(Default)]
struct Tally {
    granted: Vec<(usize, Fence)>,
    held: Vec<Held>,
    errors: Vec<Error>,
}

impl Tally {
    fn refusals(&self) -> usize {
        self.held.len() + self.errors.len()
    }

    /// What a request that did not reach a majority reports: busy only
    /// when more members said so than a majority can spare (`spare`), so a
    /// request that failed for errors or silence is retried, not taken as
    /// a refusal; else the last error.
    fn failure(mut self, spare: usize) -> Result<CasOutcome, Error> {
        if self.held.len() > spare {
            let named = self.held.iter().find(|h| h.holder.is_some()).cloned();
            return Ok(CasOutcome::Held(named.unwrap_or_default()));
        }
        match self.errors.pop() {
            Some(e) if e.is_retryable() => Err(e),
            _ => Err(no_majority()),
        }
    }
}

#[async_trait]
impl Backend for QuorumBackend {
    /// One request to every member at once; see [`QuorumBackend`].
    ///
    /// # Cancel safety
    /// A dropped call drops the members' requests, which may still land:
    /// the manager's owner-checked deletes (through [`delete`](Self::delete),
    /// to every member) remove them, for the longest late-write bound of
    /// the members.
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let until = Instant::now() + ttl.mul_f64(1.0 - self.drift);
        let renewal = expected == Some(new);
        let mut set = self.send_all(key, expected, new, ttl);
        let tally = self.count(&mut set, until, !renewal).await;
        if tally.granted.len() < self.majority() {
            // A failed renewal takes nothing away: the hold ends at its TTL
            // where it was renewed, and a passing failure can still heal.
            if renewal {
                set.detach_all();
            } else {
                self.undo(key, new, &tally.granted, set);
            }
            return tally.failure(self.members.len() - self.majority());
        }
        // The hold lives on the members that counted (a majority, and those
        // that answered soon after), so it outlives one of them failing; a
        // grant that lands later still is deleted, so inspect reports the
        // fence the caller was told. A renewal's stragglers renew too.
        if renewal {
            set.detach_all();
        } else {
            self.undo(key, new, &[], set);
        }
        let fence = tally
            .granted
            .iter()
            .map(|(_, f)| *f)
            .max()
            .unwrap_or(Fence(0));
        if !renewal {
            // Any later majority shares a member with every majority of
            // these, so a majority of them raising is enough.
            let granted: Vec<usize> = tally.granted.iter().map(|(i, _)| *i).collect();
            let raising = self.raise_on(key, &granted, fence, self.majority());
            let raised = tokio::time::timeout_at(until, raising).await;
            if let Err(e) = raised.unwrap_or_else(|_| Err(no_majority())) {
                self.undo(key, new, &tally.granted, JoinSet::new());
                return Err(e);
            }
        }
        Ok(CasOutcome::Acquired { fence })
    }

    /// Deletes by `owner` on every member; `true` when a majority held it.
    /// Returns once the answers decide it; the other deletes go on in the
    /// background.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let mut set = JoinSet::new();
        for m in &self.members {
            let (m, key, owner) = (m.clone(), key.clone(), owner.clone());
            set.spawn(async move { m.delete(&key, &owner).await });
        }
        let need = self.majority();
        let (mut yes, mut no, mut errors) = (0, 0, Vec::new());
        while yes < need && no + errors.len() <= self.members.len() - need {
            let Some(joined) = set.join_next().await else {
                break;
            };
            match joined {
                Ok(Ok(true)) => yes += 1,
                Ok(Ok(false)) => no += 1,
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(Error::store("quorum", e.to_string(), true)),
            }
        }
        set.detach_all();
        if yes >= need || no > self.members.len() - need {
            return Ok(yes >= need);
        }
        match errors.pop() {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    fn name(&self) -> &'static str {
        "quorum"
    }

    fn limits(&self) -> Limits {
        let mut all = self.members.iter().map(|m| m.limits());
        let first = all.next().unwrap_or_default();
        // The members are asked in tasks of their own, in no order.
        all.fold(first, Limits::both).with_in_order(false)
    }

    /// The earliest of the members' bounds that could belong to this
    /// request. Every member that granted it promises at least half the TTL
    /// from the send (a store that bounds by a session lease, as etcd, only
    /// hands out leases with two thirds of their TTL left); a lower bound is
    /// a member that did not grant it (an etcd session lease nothing renews
    /// any more), and is left out. Counting a member that did not grant it
    /// can only make the bound earlier. Fewer than a majority promising:
    /// no validity at all.
    fn earliest_expiry(&self, ttl: Duration, sent_at: Instant) -> Instant {
        let floor = sent_at + ttl / 2;
        let promised: Vec<Instant> = self
            .members
            .iter()
            .map(|m| m.earliest_expiry(ttl, sent_at))
            .filter(|e| *e >= floor)
            .collect();
        if promised.len() < self.majority() {
            return sent_at;
        }
        promised.into_iter().min().unwrap_or(sent_at)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        Some(&self.clock)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        Some(self)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        Some(self)
    }

    /// Where every member stores descriptions.
    fn describer(&self) -> Option<&dyn Describe> {
        if self.members.iter().all(|m| m.describer().is_some()) {
            Some(self)
        } else {
            None
        }
    }
}

#[async_trait]
impl RaiseFence for QuorumBackend {
    /// Raises the minimum on every member; returns once a majority did
    /// (the others go on in the background).
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        let all: Vec<usize> = (0..self.members.len()).collect();
        self.raise_on(key, &all, minimum, self.majority()).await
    }
}
