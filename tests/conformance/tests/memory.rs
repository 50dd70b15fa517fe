//! The whole conformance suite against the in-memory reference backend.

use moltlock_core::MemoryBackend;

fn memory() -> moltlock_conformance::Factory {
    let shared = MemoryBackend::new();
    moltlock_conformance::factory(move || {
        let b = shared.clone();
        async move { Ok(b) }
    })
}

moltlock_conformance::conformance_tests!(memory(), without: [fair_queue]);

/// A factory's cleanup runs after a case with every key the case made,
/// those its spawned checks use included (the fractional-TTL case makes
/// one key per spawned check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_gets_every_key_its_case_made() {
    use std::sync::{Arc, Mutex};

    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let factory = memory().with_cleanup(move |keys| {
        if let Ok(mut seen) = record.lock() {
            seen.extend(keys);
        }
        async {}
    });
    let case = moltlock_conformance::case_named("fractional_ttls_are_honoured");
    moltlock_conformance::assert_case(case.expect("the suite has the case"), factory).await;
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter().all(|k| k.starts_with("mlconf/fractional/")),
        "{seen:?}"
    );
}

/// The suite again over a migrating backend in its `Both` phase: two memory
/// stores, locked old first.
mod migrating_both {
    use std::sync::Arc;

    use moltlock_core::{Backend, MemoryBackend, MigratingBackend, Phase};

    fn both() -> moltlock_conformance::Factory {
        let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
        moltlock_conformance::factory(move || {
            let old: Arc<dyn Backend> = Arc::new(old.clone());
            let new: Arc<dyn Backend> = Arc::new(new.clone());
            async move { MigratingBackend::new(old, new, Phase::Both) }
        })
    }

    moltlock_conformance::conformance_tests!(both(), without: [fair_queue, cas_multi, in_order]);
}

/// The suite again over a quorum of three memory stores: each client is a
/// quorum over the same three.
mod quorum_of_three {
    use std::sync::Arc;

    use moltlock_core::{Backend, MemoryBackend, QuorumBackend};

    fn quorum() -> moltlock_conformance::Factory {
        let stores = [
            MemoryBackend::new(),
            MemoryBackend::new(),
            MemoryBackend::new(),
        ];
        moltlock_conformance::factory(move || {
            let members: Vec<Arc<dyn Backend>> = stores
                .iter()
                .map(|s| Arc::new(s.clone()) as Arc<dyn Backend>)
                .collect();
            async move { QuorumBackend::new(members) }
        })
    }

    moltlock_conformance::conformance_tests!(
        quorum(),
        without: [watch, fair_queue, cas_multi, in_order]
    );
}

/// Holds taken at scattered times are renewed together: once the first is
/// due, every renewal request carries all of them, so the manager sends one
/// request per interval however its holds were spread.
#[tokio::test]
async fn scattered_holds_share_one_renewal_per_interval() {
    use std::sync::Arc;
    use std::time::Duration;

    use moltlock_conformance::Partition;
    use moltlock_core::{LockManager, MemoryBackend};

    let store = Partition::new(Arc::new(MemoryBackend::new()));
    // TTL 600 ms: renewed every 200 ms.
    let manager = LockManager::builder(store.clone())
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..5 {
        guards.push(manager.lock(format!("scattered/{i}")).await.unwrap());
        // Spread over 160 ms: most of an interval.
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let batches = store.renewal_batches();
    assert!(batches.len() >= 3, "too few renewals: {batches:?}");
    assert!(
        batches.iter().all(|n| *n == 5),
        "a renewal left holds for another request: {batches:?}"
    );
    assert!(guards.iter().all(|g| g.is_held()));
}
