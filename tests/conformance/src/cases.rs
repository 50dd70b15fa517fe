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
mod exclusion;
mod expiry;
mod fair;
mod fences;
mod lost;
mod optional;
mod ownership;

pub use cancel::*;
pub use exclusion::*;
pub use expiry::*;
pub use fair::*;
pub use fences::*;
pub use lost::*;
pub use optional::*;
pub use ownership::*;

/// One [`Case`]: its function, its contract point, and the group of the
/// case list it is in (`always`, or the extension it needs).
macro_rules! case {
    (@need always) => { None };
    (@need watch) => { Some(Need::Watch) };
    (@need inspect) => { Some(Need::Inspect) };
    (@need fair_queue) => { Some(Need::FairQueue) };
    (@need raise_fence) => { Some(Need::RaiseFence) };
    (@need describe) => { Some(Need::Describe) };
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
            ],
            fair_queue: [
                fair_queue_serves_in_arrival_order: "fair queue",
                fair_newcomer_does_not_barge: "fair queue",
                fair_dropped_waiter_leaves_the_queue: "fair queue, 6 cancellation",
                fences_rise_across_fair_and_plain: "5 fencing, fair queue",
            ],
            raise_fence: [
                raise_fence_lifts_later_fences: "5 fencing",
                raise_fence_is_a_max: "5 fencing",
                racing_raises_keep_the_largest: "5 fencing",
            ],
            describe: [
                descriptions_belong_to_their_hold: "2 owner checks",
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
