//! The suite checks itself: each deliberately broken backend must fail the
//! cases that guard against its flaw, and the same backend without the flaw
//! must pass them.

use moltlock_conformance::broken::{Flaw, Flawed};
use moltlock_conformance::{cases, factory, run_case, Case, Factory, Outcome};

fn flawed(flaw: Flaw) -> Factory {
    let shared = Flawed::new(flaw);
    factory(move || {
        let b = shared.clone();
        async move { Ok(b) }
    })
}

fn case(name: &str) -> &'static Case {
    match cases::ALL.iter().find(|c| c.name == name) {
        Some(c) => c,
        None => panic!("no case named {name}"),
    }
}

/// Runs the named cases against `flaw` and against a sound store; the flawed
/// store must fail at least one and the sound one must pass all.
async fn caught(flaw: Flaw, names: &[&str]) {
    let mut failures = Vec::new();
    for name in names {
        let sound = run_case(case(name), flawed(Flaw::None)).await;
        assert_eq!(sound, Ok(Outcome::Passed), "{name} fails on a sound store");
        if let Err(msg) = run_case(case(name), flawed(flaw)).await {
            failures.push(format!("{name}: {msg}"));
        }
    }
    assert!(!failures.is_empty(), "the suite did not catch {flaw:?}");
    println!("{flaw:?} caught by: {failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_unconditional_delete() {
    caught(
        Flaw::UnconditionalDelete,
        &[
            "release_with_foreign_token_changes_nothing",
            "double_release_reports_not_held",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_read_then_write_cas() {
    caught(Flaw::ReadThenWrite, &["mutual_exclusion_under_contention"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_ignored_ttl() {
    caught(Flaw::IgnoresTtl, &["key_expires_after_ttl"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_repeating_fence() {
    caught(Flaw::RepeatingFence, &["fences_increase_across_release"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catches_foreign_renewal() {
    caught(
        Flaw::RenewsForeignToken,
        &["renew_with_foreign_token_changes_nothing"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sound_flawed_store_passes_every_core_case() {
    for c in cases::ALL {
        let res = run_case(c, flawed(Flaw::None)).await;
        assert!(res.is_ok(), "{} fails on a sound store: {res:?}", c.name);
    }
}
