//! The cases of the suite, one function per point of the lock contract.

use crate::{Case, Need};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

mod cancel;
mod common;
pub(crate) use common::take_keys;
mod election;
mod exclusion;
mod expiry;
mod fair;
mod fences;
mod jobs;
mod lost;
mod multi;
mod optional;
mod ownership;
mod revocation;
mod rwlock;
mod semaphore;

pub use cancel::*;
pub use election::*;
pub use exclusion::*;
pub use expiry::*;
pub use fair::*;
pub use fences::*;
pub use jobs::*;
pub use lost::*;
pub use multi::*;
pub use optional::*;
pub use ownership::*;
pub use revocation::*;
pub use rwlock::*;
pub use semaphore::*;

/// One [`Case`]: its function, its contract point, and the group of the
/// case list it is in (`always`, or the extension it needs).
macro_rules! case {
    (@need always) => { None };
    (@need watch) => { Some(Need::Watch) };
    (@need inspect) => { Some(Need::Inspect) };
    (@need fair_queue) => { Some(Need::FairQueue) };
    (@need raise_fence) => { Some(Need::RaiseFence) };
    (@need describe) => { Some(Need::Describe) };
    (@need cas_multi) => { Some(Need::CasMulti) };
    (@need in_order) => { Some(Need::InOrder) };
    ($name:ident, $point:literal, $group:ident) => {
        Case {
            name: stringify!($name),
            point: $point,
            needs: case!(@need $group),
            run: |f| Box::pin($name(f)),
        }
    };
}

/// Every case of the suite, in the order `run_all` runs them, grouped by
/// the extension it needs (`always`: none), each with the contract point
/// (`docs/CONTRACT.md`) it proves. Written once: [`ALL`] and
/// `conformance_tests!` are both made from it, through the callback macro
/// given.
#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($callback:path; $($pass:tt)*) => {
        $callback! { $($pass)*;
            always: [
                acquire_and_release: "1 mutual exclusion",
                try_lock_on_held_key_returns_none: "1 mutual exclusion",
                distinct_keys_do_not_conflict: "1 mutual exclusion",
                mutual_exclusion_under_contention: "1 mutual exclusion",
                mutual_exclusion_across_clients: "1 mutual exclusion",
                expired_key_race_has_one_winner: "1 mutual exclusion, 3 expiry",
                release_with_foreign_token_changes_nothing: "2 owner checks",
                renew_with_foreign_token_changes_nothing: "2 owner checks",
                cas_with_wrong_expected_changes_nothing: "2 owner checks",
                double_release_reports_not_held: "2 owner checks",
                delete_of_expired_hold_reports_false: "2 owner checks, 3 expiry",
                hand_over_gives_a_fresh_fence: "2 owner checks, 5 fencing",
                tokens_are_compared_exactly: "2 owner checks",
                keys_are_distinct_exactly: "1 mutual exclusion",
                held_reply_names_the_real_holder: "1 mutual exclusion",
                key_expires_after_ttl: "3 expiry",
                fractional_ttls_are_honoured: "3 expiry, 4 validity deadline",
                no_hold_ends_before_its_promised_expiry: "3 expiry, 4 validity deadline",
                shared_lease_reports_earliest_expiry: "4 validity deadline",
                waiter_acquires_after_holder_stops_renewing: "3 expiry",
                renewal_keeps_lock_past_several_ttls: "3 expiry",
                renewal_after_expiry_is_refused: "2 owner checks, 3 expiry",
                renewal_sets_expiry_from_now: "3 expiry",
                batch_renewal_keeps_many_locks: "3 expiry",
                renew_many_answers_per_item: "2 owner checks",
                renew_many_uses_each_items_ttl: "3 expiry",
                fences_increase_across_release: "5 fencing",
                fences_increase_across_expiry: "5 fencing",
                fences_increase_across_clients: "5 fencing",
                fences_rise_across_long_lived_clients: "5 fencing",
                fences_rise_under_contention: "5 fencing",
                fenced_resource_refuses_stale_holder: "5 fencing",
                lost_fires_when_key_deleted_behind_holder: "4 lost signals",
                lost_fires_before_store_expiry_when_cut_off: "4 validity deadline",
                lost_callback_is_called: "4 lost signals",
                duplicate_delivery_does_not_wait_on_itself: "6 no hold nobody owns",
                dropped_waiter_leaves_no_hold: "6 cancellation",
                cancelled_acquires_leave_no_orphan: "6 cancellation",
                dropped_guard_releases_key: "6 cancellation",
                longest_allowed_key_and_unicode_work: "8 input limits",
                semaphore_never_over_admits: "9 semaphores",
                semaphore_permit_of_dead_holder_returns: "9 semaphores, 3 expiry",
                semaphore_renewal_keeps_permits: "9 semaphores, 3 expiry",
                semaphore_cancelled_acquire_leaves_no_permit: "9 semaphores, 6 cancellation",
                semaphore_fences_rise_per_slot: "9 semaphores, 5 fencing",
                rw_readers_share_and_writer_excludes: "10 read-write locks, 5 fencing",
                rw_writer_is_not_starved: "10 read-write locks",
                rw_dead_reader_frees_only_its_slot: "10 read-write locks, 3 expiry",
                rw_cancelled_writer_leaves_nothing: "10 read-write locks, 6 cancellation",
                lock_all_is_all_or_nothing: "11 multi-locks",
                lock_all_in_any_order_never_deadlocks: "11 multi-locks, 1 mutual exclusion",
                lock_all_timeout_is_cumulative: "11 multi-locks, 3 expiry",
                lock_all_cancel_leaves_nothing: "11 multi-locks, 6 cancellation",
                lock_all_lost_fires_when_any_key_is_lost: "11 multi-locks, 4 lost signals",
                job_at_least_blocks_after_an_early_release: "12 job locks, 3 expiry",
                job_at_least_blocks_to_its_last_millisecond: "12 job locks, 3 expiry",
                job_at_most_stops_the_holder: "12 job locks, 4 lost signals",
                election_has_one_leader_under_churn: "13 elections, 1 mutual exclusion, 5 fencing",
                election_cut_off_leader_knows_before_a_successor_leads: "13 elections, 4 lost signals",
                election_dropped_campaign_leaves_no_candidate: "13 elections, 6 cancellation",
            ],
            watch: [
                release_wakes_waiter_quickly: "waiting",
                watch_subscribes_before_it_returns: "waiting",
                watch_fires_for_every_release: "waiting",
            ],
            inspect: [
                inspect_reports_holder: "inspect",
                inspect_and_list_are_exact: "inspect",
                inspect_hides_expired_holds: "inspect, 3 expiry",
                semaphore_limit_mismatch_is_reported: "9 semaphores, inspect",
                election_observe_sees_every_term: "13 elections, inspect",
                revoke_stops_the_holder_and_spares_the_next: "14 revocation, 4 lost signals, 5 fencing",
                release_request_reaches_only_its_holder: "14 revocation, 2 owner checks",
            ],
            fair_queue: [
                fair_queue_serves_in_arrival_order: "fair queue",
                fair_newcomer_does_not_barge: "fair queue",
                fair_dropped_waiter_leaves_the_queue: "fair queue, 6 cancellation",
                fair_frozen_waiter_loses_its_place: "fair queue, 4 expiry",
                fair_newcomer_waits_behind_a_frozen_place: "fair queue",
                fair_waiter_does_not_pass_a_place_ahead: "fair queue, 6 cancellation",
                fair_acquire_does_not_wait_on_its_own_hold: "fair queue, 2 owner checks",
                fences_rise_across_fair_and_plain: "5 fencing, fair queue",
            ],
            raise_fence: [
                raise_fence_lifts_later_fences: "5 fencing",
                raise_fence_is_a_max: "5 fencing",
                racing_raises_keep_the_largest: "5 fencing",
            ],
            describe: [
                descriptions_belong_to_their_hold: "2 owner checks",
                election_proclaim_is_owner_checked: "13 elections, 2 owner checks, describe",
            ],
            cas_multi: [
                cas_multi_all_takes_nothing_when_one_is_held: "11 multi-locks, cas_multi",
                cas_multi_all_is_never_seen_partial: "11 multi-locks, cas_multi",
                cas_multi_any_takes_the_first_free: "9 semaphores, cas_multi, 3 expiry",
            ],
            in_order: [
                delete_lands_before_a_later_attempt: "2 owner checks, in order",
            ],
        }
    };
}

macro_rules! all_cases {
    (; $($group:ident: [$($name:ident: $point:literal,)*],)*) => {
        /// Every case, in the order `run_all` runs them, with the contract
        /// point (`docs/CONTRACT.md`) each proves.
        pub const ALL: &[Case] = &[$($(case!($name, $point, $group),)*)*];
    };
}

crate::__cases!(all_cases;);
