//! Leader election: one leader at a time under churn, terms that rise from
//! leader to leader, a cut-off leader that learns of its loss before a
//! successor is granted, an observer that sees every term, owner-checked
//! values, and campaigns that leave nothing behind when dropped.

use moltlock_core::LostReason;

use super::common::*;

/// A client, a fresh election name, and an election on it (TTL 3 × the
/// short TTL).
async fn open_election(
    f: &Factory,
    case: &str,
) -> Result<(Arc<dyn Backend>, String, moltlock_core::Election), String> {
    let name = key(case);
    let b = f.open().await?;
    let election = manager(&b, short_ttl(&b) * 3)?
        .election(&name)
        .map_err(err)?;
    Ok((b, name, election))
}

/// Candidates on two clients campaign, lead briefly and resign, over and
/// over: never two leaders at once, and each leader's term is above the
/// last one's.
pub async fn election_has_one_leader_under_churn(f: Factory) -> CaseResult {
    let name = key("election-churn");
    let overlap = Arc::new(OverlapDetector::new());
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in 0..2 {
        let b = f.open().await?;
        let m = manager(&b, short_ttl(&b) * 3)?;
        for candidate in 0..3 {
            let election = m.election(&name).map_err(err)?;
            let (overlap, terms) = (overlap.clone(), terms.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..3 {
                    let value = format!("client {client} candidate {candidate} round {round}");
                    let lead = election.campaign(value).await.map_err(err)?;
                    overlap.enter();
                    terms.lock().map_err(|e| e.to_string())?.push(lead.term().0);
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    overlap.exit();
                    lead.resign().await.map_err(err)?;
                }
                Ok::<(), String>(())
            }));
        }
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    ensure!(
        overlap.overlaps() == 0,
        "{} times two leaders at once",
        overlap.overlaps()
    );
    let terms = terms.lock().map_err(|e| e.to_string())?.clone();
    ensure!(terms.len() == 18, "{} leaderships, not 18", terms.len());
    ensure!(
        terms.windows(2).all(|w| w[1] > w[0]),
        "terms did not rise from leader to leader: {terms:?}"
    );
    Ok(Outcome::Passed)
}

/// A leader cut off from the store learns of it (`lost()`) before the next
/// candidate is granted the leadership.
pub async fn election_cut_off_leader_knows_before_a_successor_leads(f: Factory) -> CaseResult {
    let name = key("election-cut");
    let store = f.open().await?;
    let ttl = short_ttl(&store) * 2;
    let cut = Partition::new(store);
    let old = LockManager::builder(cut.clone())
        .ttl(ttl)
        .build()
        .map_err(err)?;
    let lead = old
        .election(&name)
        .map_err(err)?
        .campaign("old")
        .await
        .map_err(err)?;
    let b = f.open().await?;
    let next = manager(&b, ttl)?.election(&name).map_err(err)?;
    let successor = tokio::spawn(async move {
        let lead = next.campaign("new").await.map_err(err)?;
        Ok::<_, String>((Instant::now(), lead))
    });
    cut.cut();
    let reason = tokio::time::timeout(ttl * 2, lead.lost()).await;
    let knew_at = Instant::now();
    ensure!(
        reason.is_ok(),
        "the cut-off leader never learned of its loss"
    );
    let (led_at, new_lead) = tokio::time::timeout(ttl * 3, successor)
        .await
        .map_err(|_| "no successor after the old leadership expired".to_string())?
        .map_err(|e| e.to_string())??;
    ensure!(
        knew_at <= led_at,
        "a successor led {:?} before the old leader knew it had lost",
        knew_at - led_at
    );
    ensure!(
        new_lead.term() > lead.term(),
        "the successor's term is not above"
    );
    new_lead.resign().await.map_err(err)?;
    Ok(Outcome::Passed)
}

/// A campaign dropped while it waits leaves no candidate: once the leader
/// resigns, the key is free, and nobody leads.
pub async fn election_dropped_campaign_leaves_no_candidate(f: Factory) -> CaseResult {
    let (b, name, election) = open_election(&f, "election-dropped").await?;
    let lead = election.campaign("leader").await.map_err(err)?;
    let waiting = election.campaign("waiter");
    let early = tokio::time::timeout(Duration::from_millis(200), waiting).await;
    ensure!(early.is_err(), "a second candidate led beside the first");
    lead.resign().await.map_err(err)?;
    let other = f.open().await?;
    ensure!(
        becomes_free(&other, &name, Duration::from_secs(2)).await?,
        "a dropped campaign left a candidate holding the key"
    );
    tokio::time::sleep(short_ttl(&b)).await;
    ensure!(
        is_free(&other, &name, short_ttl(&b)).await?,
        "a dropped campaign led later"
    );
    Ok(Outcome::Passed)
}

/// `leader()` reports the value and term; `proclaim` changes the value
/// only while its leader holds the leadership.
pub async fn election_proclaim_is_owner_checked(f: Factory) -> CaseResult {
    let (b, _, election) = open_election(&f, "election-proclaim").await?;
    let first = election.campaign("first").await.map_err(err)?;
    first.proclaim("first, proclaimed").await.map_err(err)?;
    let seen = election
        .leader()
        .await
        .map_err(err)?
        .ok_or("nobody leads")?;
    ensure!(
        seen.value.as_deref() == Some("first, proclaimed"),
        "value {:?}",
        seen.value
    );
    ensure!(
        seen.term == Some(first.term()),
        "term {:?} is not the leader's",
        seen.term
    );
    // Taken away behind its back; a new leader comes.
    b.delete(first.guard().key(), first.guard().token())
        .await
        .map_err(err)?;
    let second = election.campaign("second").await.map_err(err)?;
    let stale = first.proclaim("first again").await;
    ensure!(
        matches!(stale, Err(Error::NotHeld { .. })),
        "a deposed leader's proclaim gave {stale:?}"
    );
    let seen = election
        .leader()
        .await
        .map_err(err)?
        .ok_or("nobody leads")?;
    ensure!(
        seen.value.as_deref() == Some("second"),
        "the value became {:?}",
        seen.value
    );
    let reason = tokio::time::timeout(short_ttl(&b) * 2, first.lost()).await;
    ensure!(
        reason == Ok(LostReason::Refused),
        "the deposed leader's lost(): {reason:?}"
    );
    second.resign().await.map_err(err)?;
    Ok(Outcome::Passed)
}

/// Five leaders one after the other: an observer sees each one's term, in
/// order, and nobody leading at the end.
pub async fn election_observe_sees_every_term(f: Factory) -> CaseResult {
    let (_, _, election) = open_election(&f, "election-observe").await?;
    let mut observer = election.observe();
    let mut terms = Vec::new();
    for i in 0..5 {
        let lead = election
            .campaign(format!("leader {i}"))
            .await
            .map_err(err)?;
        terms.push(lead.term());
        tokio::time::sleep(Duration::from_millis(500)).await;
        lead.resign().await.map_err(err)?;
    }
    let mut seen = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        match tokio::time::timeout(Duration::from_millis(600), observer.next()).await {
            Ok(Some(Ok(Some(leader)))) => {
                // A leader's value is stored just after its hold: it may
                // show twice, without and with it.
                if leader.term.is_some() && seen.last() != leader.term.as_ref() {
                    seen.extend(leader.term);
                }
            }
            Ok(Some(Ok(None))) if seen.len() >= terms.len() => break,
            Ok(Some(Ok(None))) => {}
            Ok(Some(Err(e))) => return Err(format!("observe failed: {e}")),
            Ok(None) => return Err("the observer ended".into()),
            Err(_) => break,
        }
    }
    ensure!(seen == terms, "observed terms {seen:?}, not {terms:?}");
    Ok(Outcome::Passed)
}
