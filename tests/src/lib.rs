//! The MoltLock conformance suite: plain async functions that each prove one
//! point of the lock contract against a live [`Backend`], and a macro that
//! stamps them into `#[tokio::test]`s.
//!
//! ```no_run
//! // tests/conformance.rs of a backend crate (needs tokio as a dev-dependency)
//! # use moltlock_core::MemoryBackend as MyBackend;
//! fn store() -> moltlock_conformance::Factory {
//!     let shared = MyBackend::new();
//!     moltlock_conformance::factory(move || {
//!         let b = shared.clone();
//!         async move { Ok(b) }
//!     })
//! }
//! moltlock_conformance::conformance_tests!(store());
//! # fn main() {}
//! ```
//!
//! A factory returns handles on **one** store: the suite opens several to
//! play independent clients (a second handle deletes a key behind a holder's
//! back, a fresh handle proves fences survive a new client). Each case uses
//! keys under its own random prefix, so cases run in parallel on one store.
//! Capabilities a backend declares select the optional cases; a case whose
//! capability is missing reports [`Outcome::Skipped`].

pub mod broken;
pub mod cases;
pub mod fixtures;
mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{Backend, Error};

pub use support::{FencedResource, OverlapDetector, Partition};

/// A boxed future, as the suite's functions return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type OpenFn = dyn Fn() -> BoxFuture<Result<Arc<dyn Backend>, Error>> + Send + Sync;

/// Opens handles on the store under test.
#[derive(Clone)]
pub struct Factory {
    make: Arc<OpenFn>,
}

impl Factory {
    /// A new handle (client) on the store under test.
    ///
    /// # Errors
    /// The failure to connect, as text.
    pub async fn open(&self) -> Result<Arc<dyn Backend>, String> {
        (self.make)()
            .await
            .map_err(|e| format!("could not open a backend: {e}"))
    }
}

/// Wraps a closure that opens a handle on the store under test.
pub fn factory<F, Fut, B>(f: F) -> Factory
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B, Error>> + Send + 'static,
    B: Backend,
{
    let f = Arc::new(f);
    Factory {
        make: Arc::new(move || {
            let f = f.clone();
            Box::pin(async move { f().await.map(|b| Arc::new(b) as Arc<dyn Backend>) })
        }),
    }
}

/// Wraps a closure that opens shared handles (`Arc<dyn Backend>`), for
/// backends chosen at run time.
pub fn factory_dyn<F, Fut>(f: F) -> Factory
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<dyn Backend>, Error>> + Send + 'static,
{
    let f = Arc::new(f);
    Factory {
        make: Arc::new(move || {
            let f = f.clone();
            Box::pin(async move { f().await })
        }),
    }
}

/// How a case ended when it did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// The backend lacks the capability the case needs.
    Skipped(String),
}

/// What every case returns: a failure is a message saying what broke.
pub type CaseResult = Result<Outcome, String>;

/// One case of the suite, by name.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name (also its test function's name).
    pub name: &'static str,
    /// Runs the case.
    pub run: fn(Factory) -> BoxFuture<CaseResult>,
}

/// The longest a case may take before it counts as failed.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one case with the suite's time limit.
pub async fn run_case(case: &Case, factory: Factory) -> CaseResult {
    match tokio::time::timeout(CASE_TIMEOUT, (case.run)(factory)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "{} did not finish within {CASE_TIMEOUT:?}",
            case.name
        )),
    }
}

/// Runs every case, one after another, and returns each result by name.
pub async fn run_all(factory: Factory) -> Vec<(&'static str, CaseResult)> {
    let mut out = Vec::new();
    for case in cases::ALL {
        out.push((case.name, run_case(case, factory.clone()).await));
    }
    out
}

/// Runs a case in a test and panics with its message if it failed.
pub async fn assert_case(case: &Case, factory: Factory) {
    match run_case(case, factory).await {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::Skipped(why)) => println!("{}: skipped: {why}", case.name),
        Err(msg) => panic!("conformance case {} failed: {msg}", case.name),
    }
}

/// Stamps every conformance case into a `#[tokio::test]` for the factory
/// expression given (evaluated once per test). The calling crate needs
/// `tokio` (with `macros` and `rt-multi-thread`) as a dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@cases $factory;
            acquire_and_release,
            try_lock_on_held_key_returns_none,
            distinct_keys_do_not_conflict,
            mutual_exclusion_under_contention,
            mutual_exclusion_across_clients,
            release_with_foreign_token_changes_nothing,
            renew_with_foreign_token_changes_nothing,
            cas_with_wrong_expected_changes_nothing,
            double_release_reports_not_held,
            key_expires_after_ttl,
            waiter_acquires_after_holder_stops_renewing,
            renewal_keeps_lock_past_several_ttls,
            batch_renewal_keeps_many_locks,
            fences_increase_across_release,
            fences_increase_across_expiry,
            fences_increase_across_clients,
            fenced_resource_refuses_stale_holder,
            lost_fires_when_key_deleted_behind_holder,
            lost_fires_before_store_expiry_when_cut_off,
            lost_callback_is_called,
            lock_timeout_returns_timeout_error,
            dropped_waiter_leaves_no_hold,
            cancelled_acquires_leave_no_orphan,
            dropped_guard_releases_key,
            empty_key_rejected,
            overlong_key_rejected,
            control_character_key_rejected,
            longest_allowed_key_and_unicode_work,
            bad_ttl_rejected,
            tokens_are_random_uuid_v4,
            release_wakes_waiter_quickly,
            inspect_reports_holder,
            fair_queue_serves_in_arrival_order,
            raise_fence_lifts_later_fences
        );
    };
    (@cases $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let factory: $crate::Factory = $factory;
                let case = $crate::Case {
                    name: stringify!($name),
                    run: |f| ::std::boxed::Box::pin($crate::cases::$name(f)),
                };
                $crate::assert_case(&case, factory).await;
            }
        )*

        #[test]
        fn conformance_macro_stamps_every_case() {
            let mut stamped = vec![$(stringify!($name)),*];
            let mut all: Vec<&str> = $crate::cases::ALL.iter().map(|c| c.name).collect();
            stamped.sort_unstable();
            all.sort_unstable();
            assert_eq!(stamped, all);
        }
    };
}
