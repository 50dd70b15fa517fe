//! The suite checks itself: each deliberately broken backend must fail the
//! cases that guard against its flaw, and sound stores must pass the whole
//! suite (the in-memory reference backend three times in a row).

use std::time::Duration;

use moltlock_conformance::broken::{Flaw, Flawed};
use moltlock_conformance::{
    case_named, check_stamping, factory, run_all_parallel, run_case, Bare, Factory, Outcome,
    INCONCLUSIVE, SLOW,
};
use moltlock_core::MemoryBackend;

fn flawed(flaw: Flaw) -> Factory {
    let shared = Flawed::new(flaw);
    factory(move || {
        let b = shared.handle();
        async move { Ok(b) }
    })
}

/// The cases that catch each flaw; every one of them must fail.
fn killers(flaw: Flaw) -> &'static [&'static str] {
    match flaw {
        Flaw::None => &[],
        Flaw::UnconditionalDelete => &[
            "release_with_foreign_token_changes_nothing",
            "double_release_reports_not_held",
        ],
        Flaw::ReadThenWrite => &[
            "mutual_exclusion_under_contention",
            "semaphore_never_over_admits",
            "rw_readers_share_and_writer_excludes",
            "lock_all_in_any_order_never_deadlocks",
        ],
        Flaw::IgnoresTtl => &[
            "key_expires_after_ttl",
            "fractional_ttls_are_honoured",
            "semaphore_permit_of_dead_holder_returns",
            "rw_dead_reader_frees_only_its_slot",
            "lock_all_timeout_is_cumulative",
        ],
        Flaw::TakesHeldKey => &[
            "try_lock_on_held_key_returns_none",
            "dropped_waiter_leaves_no_hold",
            "job_at_least_blocks_to_its_last_millisecond",
        ],
        Flaw::CasIgnoresExpected => &["cas_with_wrong_expected_changes_nothing"],
        Flaw::RepeatingFence => &[
            "fences_increase_across_release",
            "fences_increase_across_expiry",
            "fences_increase_across_clients",
            "fenced_resource_refuses_stale_holder",
            "raise_fence_lifts_later_fences",
            "mutual_exclusion_across_clients",
            "hand_over_gives_a_fresh_fence",
            "semaphore_fences_rise_per_slot",
            "election_has_one_leader_under_churn",
            "election_cut_off_leader_knows_before_a_successor_leads",
            "election_observe_sees_every_term",
        ],
        Flaw::FenceRestartsAfterExpiry => &["fences_increase_across_expiry"],
        Flaw::RenewsForeignToken => &[
            "renew_with_foreign_token_changes_nothing",
            "lost_fires_when_key_deleted_behind_holder",
            "lost_callback_is_called",
        ],
        Flaw::ExpiredTakeoverReadThenWrite => &["expired_key_race_has_one_winner"],
        Flaw::WholeSecondTtl => &[
            "fractional_ttls_are_honoured",
            "lost_fires_before_store_expiry_when_cut_off",
        ],
        Flaw::CoarseClock => &["fractional_ttls_are_honoured"],
        Flaw::EndsEarly => &["no_hold_ends_before_its_promised_expiry"],
        Flaw::SharedLeaseWrongBound => &["shared_lease_reports_earliest_expiry"],
        Flaw::RenewsExpiredHold => &["renewal_after_expiry_is_refused"],
        Flaw::RenewalAddsTtl => &["renewal_sets_expiry_from_now"],
        Flaw::TakeoverKeepsOldToken => &[
            "expired_key_race_has_one_winner",
            "waiter_acquires_after_holder_stops_renewing",
        ],
        Flaw::HandOverKeepsFence => &["hand_over_gives_a_fresh_fence"],
        Flaw::HandOverKeepsExpiry => &["job_at_least_blocks_after_an_early_release"],
        Flaw::DeleteLandsLate => &["delete_lands_before_a_later_attempt"],
        Flaw::DeleteIgnoresExpiry => &["delete_of_expired_hold_reports_false"],
        Flaw::DeleteAlwaysTrue => &[
            "release_with_foreign_token_changes_nothing",
            "delete_of_expired_hold_reports_false",
        ],
        Flaw::PerClientFenceBlocks => &["fences_rise_across_long_lived_clients"],
        Flaw::FenceDrawnBeforeConflict => &["fences_rise_under_contention"],
        Flaw::BatchAnswersFirstForAll => &["renew_many_answers_per_item"],
        Flaw::BatchUsesFirstTtl => &["renew_many_uses_each_items_ttl"],
        Flaw::BatchRecreatesDeleted => &[
            "renew_many_answers_per_item",
            "revoke_stops_the_holder_and_spares_the_next",
            "lock_all_lost_fires_when_any_key_is_lost",
        ],
        Flaw::WatchSubscribesLazily => &["watch_subscribes_before_it_returns"],
        Flaw::ReleaseNotAnnounced => &["release_wakes_waiter_quickly"],
        Flaw::WatchFiresOnce => &["watch_fires_for_every_release"],
        Flaw::InspectReportsFullTtl => &["inspect_and_list_are_exact"],
        Flaw::InspectShowsExpired => &[
            "inspect_hides_expired_holds",
            "semaphore_limit_mismatch_is_reported",
        ],
        Flaw::ListIgnoresPrefix => &["inspect_and_list_are_exact"],
        Flaw::ListPrefixAsPattern => &["inspect_and_list_are_exact"],
        Flaw::InspectReportsLatestFence => &["inspect_and_list_are_exact"],
        Flaw::InspectReportsFirstHolder => &["release_request_reaches_only_its_holder"],
        Flaw::FairBarges => &[
            "fair_newcomer_does_not_barge",
            "fair_newcomer_waits_behind_a_frozen_place",
        ],
        Flaw::FairServesNewestFirst => &["fair_queue_serves_in_arrival_order"],
        Flaw::FairKeepsDroppedPlace => &["fair_dropped_waiter_leaves_the_queue"],
        Flaw::FairKeepsFrozenPlace => &["fair_frozen_waiter_loses_its_place"],
        Flaw::FairPassesAhead => &["fair_waiter_does_not_pass_a_place_ahead"],
        Flaw::FairWaitsOnOwnHold => &["fair_acquire_does_not_wait_on_its_own_hold"],
        Flaw::FairFenceSeparate => &["fences_rise_across_fair_and_plain"],
        Flaw::RaiseFenceSets => &["raise_fence_is_a_max"],
        Flaw::RaiseFenceReadThenWrite => &["racing_raises_keep_the_largest"],
        Flaw::TokenPrefixCompare => &["tokens_are_compared_exactly"],
        Flaw::TokenCaseInsensitive => &["tokens_are_compared_exactly"],
        Flaw::KeyCaseInsensitive => &["keys_are_distinct_exactly"],
        Flaw::KeyTruncated => &["keys_are_distinct_exactly"],
        Flaw::KeyFixedWidth => &["distinct_keys_do_not_conflict", "inspect_reports_holder"],
        Flaw::LongKeysRefused => &["longest_allowed_key_and_unicode_work"],
        Flaw::HeldEchoesCaller => &["held_reply_names_the_real_holder"],
        Flaw::DescribeIgnoresOwner => &[
            "descriptions_belong_to_their_hold",
            "election_proclaim_is_owner_checked",
        ],
        Flaw::DescriptionOutlivesHold => &["descriptions_belong_to_their_hold"],
        Flaw::LateLandingAfterCancel => &[
            "cancelled_acquires_leave_no_orphan",
            "semaphore_cancelled_acquire_leaves_no_permit",
        ],
        Flaw::RenewalIgnored => &[
            "renewal_keeps_lock_past_several_ttls",
            "batch_renewal_keeps_many_locks",
            "semaphore_renewal_keeps_permits",
            "rw_writer_is_not_starved",
        ],
        Flaw::DeleteMissesKey => &[
            "acquire_and_release",
            "dropped_guard_releases_key",
            "duplicate_delivery_does_not_wait_on_itself",
            "job_at_most_stops_the_holder",
            "election_dropped_campaign_leaves_no_candidate",
            "rw_cancelled_writer_leaves_nothing",
            "lock_all_cancel_leaves_nothing",
        ],
        Flaw::MultiLeavesPartial => &[
            "cas_multi_all_takes_nothing_when_one_is_held",
            "lock_all_is_all_or_nothing",
        ],
        Flaw::MultiTakesInTurn => &["cas_multi_all_is_never_seen_partial"],
        Flaw::MultiAnyTakesSeveral => &["cas_multi_any_takes_the_first_free"],
    }
}

/// Runs each killer of `flaw` against a store with that flaw: each must
/// fail, and not merely as inconclusive.
async fn caught(flaw: Flaw) {
    let names = killers(flaw);
    assert!(!names.is_empty(), "no case is named to catch {flaw:?}");
    for name in names {
        let case = case_named(name).unwrap_or_else(|| panic!("no case named {name}"));
        match run_case(case, flawed(flaw)).await {
            Ok(outcome) => panic!("{name} passed on a store with {flaw:?}: {outcome:?}"),
            Err(msg) => {
                assert!(
                    !msg.starts_with(INCONCLUSIVE) && !msg.starts_with(SLOW),
                    "{name} was only inconclusive on {flaw:?}: {msg}"
                );
                println!("{flaw:?} caught by {name}: {msg}");
            }
        }
    }
}

macro_rules! catches {
    ($($test:ident: $flaw:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                caught(Flaw::$flaw).await;
            }
        )*

        /// Every case of the suite is shown to fail: some flaw names it
        /// among its killers (and [`caught`] runs it there).
        #[test]
        fn every_case_fails_on_some_broken_backend() {
            let named: Vec<&str> = Flaw::ALL.iter().flat_map(|f| killers(*f).iter().copied()).collect();
            let never: Vec<&str> = moltlock_conformance::cases::ALL
                .iter()
                .map(|c| c.name)
                .filter(|n| !named.contains(n))
                .collect();
            assert!(never.is_empty(), "no broken backend fails {never:?}");
        }

        /// Every flaw has its self-test above.
        #[test]
        fn every_flaw_has_a_self_test() {
            let mut tested = vec![$(Flaw::$flaw),*];
            let mut all = Flaw::ALL.to_vec();
            tested.sort_by_key(|f| format!("{f:?}"));
            all.sort_by_key(|f| format!("{f:?}"));
            assert_eq!(tested, all);
            assert!(all.len() >= 20, "only {} broken backends", all.len());
        }
    };
}

catches! {
    catches_unconditional_delete: UnconditionalDelete,
    catches_read_then_write_cas: ReadThenWrite,
    catches_ignored_ttl: IgnoresTtl,
    catches_take_of_a_live_hold: TakesHeldKey,
    catches_cas_ignoring_the_expected_holder: CasIgnoresExpected,
    catches_repeating_fence: RepeatingFence,
    catches_fence_restarting_after_expiry: FenceRestartsAfterExpiry,
    catches_foreign_renewal: RenewsForeignToken,
    catches_read_then_write_takeover_of_expired_hold: ExpiredTakeoverReadThenWrite,
    catches_ttl_truncated_to_seconds: WholeSecondTtl,
    catches_expiry_kept_in_whole_seconds: CoarseClock,
    catches_holds_ending_a_moment_early: EndsEarly,
    catches_shared_lease_with_wrong_bound: SharedLeaseWrongBound,
    catches_renewal_reviving_expired_hold: RenewsExpiredHold,
    catches_renewal_adding_to_old_expiry: RenewalAddsTtl,
    catches_takeover_keeping_old_token: TakeoverKeepsOldToken,
    catches_hand_over_keeping_fence: HandOverKeepsFence,
    catches_hand_over_keeping_expiry: HandOverKeepsExpiry,
    catches_delete_landing_late: DeleteLandsLate,
    catches_delete_ignoring_expiry: DeleteIgnoresExpiry,
    catches_delete_always_reporting_success: DeleteAlwaysTrue,
    catches_per_client_fence_blocks: PerClientFenceBlocks,
    catches_fence_drawn_before_conflict: FenceDrawnBeforeConflict,
    catches_batch_answered_as_a_whole: BatchAnswersFirstForAll,
    catches_batch_with_one_ttl: BatchUsesFirstTtl,
    catches_batch_recreating_deleted_holds: BatchRecreatesDeleted,
    catches_lazy_watch: WatchSubscribesLazily,
    catches_release_without_announcement: ReleaseNotAnnounced,
    catches_watch_firing_once: WatchFiresOnce,
    catches_inspect_reporting_full_ttl: InspectReportsFullTtl,
    catches_inspect_showing_expired_holds: InspectShowsExpired,
    catches_list_ignoring_prefix: ListIgnoresPrefix,
    catches_list_prefix_taken_as_pattern: ListPrefixAsPattern,
    catches_inspect_reporting_latest_fence: InspectReportsLatestFence,
    catches_inspect_reporting_first_holder: InspectReportsFirstHolder,
    catches_fair_queue_barging: FairBarges,
    catches_fair_queue_serving_newest_first: FairServesNewestFirst,
    catches_fair_queue_keeping_dropped_places: FairKeepsDroppedPlace,
    catches_fair_queue_keeping_frozen_places: FairKeepsFrozenPlace,
    catches_fair_waiter_passing_a_place_ahead: FairPassesAhead,
    catches_fair_waiter_waiting_on_its_own_hold: FairWaitsOnOwnHold,
    catches_fair_fences_from_own_counter: FairFenceSeparate,
    catches_raise_fence_lowering: RaiseFenceSets,
    catches_raises_losing_updates: RaiseFenceReadThenWrite,
    catches_token_prefix_compare: TokenPrefixCompare,
    catches_case_insensitive_tokens: TokenCaseInsensitive,
    catches_case_insensitive_keys: KeyCaseInsensitive,
    catches_truncated_keys: KeyTruncated,
    catches_fixed_width_keys: KeyFixedWidth,
    catches_long_keys_refused_below_the_limit: LongKeysRefused,
    catches_held_reply_naming_caller: HeldEchoesCaller,
    catches_description_by_a_stranger: DescribeIgnoresOwner,
    catches_description_outliving_its_hold: DescriptionOutlivesHold,
    catches_request_landing_after_cancel: LateLandingAfterCancel,
    catches_renewal_that_keeps_the_old_expiry: RenewalIgnored,
    catches_delete_that_misses_the_key: DeleteMissesKey,
    catches_cas_multi_leaving_a_partial_set: MultiLeavesPartial,
    catches_cas_multi_taking_keys_in_turn: MultiTakesInTurn,
    catches_cas_multi_any_taking_several: MultiAnyTakesSeveral,
}

/// Runs the whole suite, six cases at once, and panics naming each case
/// that did not pass (skips are allowed only for `allowed_skips`).
async fn whole_suite_passes(f: Factory, allowed_skips: &[&str], what: &str) {
    let results = run_all_parallel(f, 6).await;
    let mut bad = Vec::new();
    for (name, r) in results {
        match r {
            Ok(Outcome::Passed) => {}
            Ok(Outcome::Skipped(why)) if allowed_skips.contains(&name) => {
                println!("{what}: {name} skipped: {why}");
            }
            other => bad.push(format!("{name}: {other:?}")),
        }
    }
    assert!(bad.is_empty(), "{what} does not pass the suite: {bad:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sound_flawed_store_passes_the_whole_suite() {
    whole_suite_passes(flawed(Flaw::None), &[], "the sound Flawed store").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_passes_the_whole_suite_three_times_in_a_row() {
    let fair: Vec<&str> = moltlock_conformance::cases::ALL
        .iter()
        .filter(|c| c.needs == Some(moltlock_conformance::Need::FairQueue))
        .map(|c| c.name)
        .collect();
    for run in 1..=3 {
        let shared = MemoryBackend::new();
        let f = factory(move || {
            let b = shared.clone();
            async move { Ok(b) }
        });
        whole_suite_passes(f, &fair, &format!("the memory backend (run {run} of 3)")).await;
    }
}

fn bare() -> Factory {
    let shared = Bare::default();
    factory(move || {
        let b = shared.clone();
        async move { Ok(b) }
    })
}

#[tokio::test]
async fn missing_capabilities_skip_their_cases() {
    for case in moltlock_conformance::cases::ALL {
        if let Some(need) = case.needs {
            let r = run_case(case, bare()).await;
            assert_eq!(
                r,
                Ok(Outcome::Skipped(need.missing().to_owned())),
                "{}",
                case.name
            );
        }
    }
}

#[tokio::test]
async fn stamping_must_match_declared_capabilities() {
    let all = [
        "watch",
        "inspect",
        "fair_queue",
        "raise_fence",
        "describe",
        "cas_multi",
        "in_order",
    ];
    assert_eq!(check_stamping(bare(), &all).await, Ok(()));
    let err = check_stamping(bare(), &["inspect"]).await.unwrap_err();
    assert!(err.contains("fair_queue"), "{err}");
    let err = check_stamping(flawed(Flaw::None), &["inspect"])
        .await
        .unwrap_err();
    assert!(err.contains("declares inspect"), "{err}");
    assert_eq!(check_stamping(flawed(Flaw::None), &[]).await, Ok(()));
}

// A backend that lacks every optional capability, stamped accordingly: its
// optional cases show as ignored in `cargo test` output.
mod bare_backend {
    moltlock_conformance::conformance_tests!(
        super::bare(),
        without: [watch, inspect, fair_queue, raise_fence, describe, cas_multi, in_order]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn stall_monitor_sees_a_blocked_runtime() {
    let monitor = moltlock_conformance::StallMonitor::start();
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Blocks the runtime's only thread, as a starved scheduler would.
    std::thread::sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let worst = monitor.stop();
    assert!(worst >= Duration::from_millis(250), "saw only {worst:?}");
}

static FLAKY_CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn inconclusive_twice(
    _: Factory,
) -> moltlock_conformance::BoxFuture<moltlock_conformance::CaseResult> {
    Box::pin(async {
        let n = FLAKY_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n < 2 {
            Err(format!("{INCONCLUSIVE}: woke late"))
        } else {
            Ok(Outcome::Passed)
        }
    })
}

fn always_inconclusive(
    _: Factory,
) -> moltlock_conformance::BoxFuture<moltlock_conformance::CaseResult> {
    Box::pin(async { Err(format!("{INCONCLUSIVE}: woke late")) })
}

#[tokio::test]
async fn inconclusive_attempts_are_run_again_and_never_pass() {
    let retried = moltlock_conformance::Case {
        name: "inconclusive_twice",
        point: "timing",
        needs: None,
        run: inconclusive_twice,
    };
    assert_eq!(run_case(&retried, bare()).await, Ok(Outcome::Passed));
    assert_eq!(FLAKY_CALLS.load(std::sync::atomic::Ordering::SeqCst), 3);
    let stuck = moltlock_conformance::Case {
        name: "always_inconclusive",
        point: "timing",
        needs: None,
        run: always_inconclusive,
    };
    let r = run_case(&stuck, bare()).await;
    assert!(matches!(&r, Err(m) if m.starts_with(INCONCLUSIVE)), "{r:?}");
}
