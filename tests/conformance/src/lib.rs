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
//! // MemoryBackend has every optional capability but the fair queue.
//! moltlock_conformance::conformance_tests!(store(), without: [fair_queue]);
//! # fn main() {}
//! ```
//!
//! A factory returns handles on **one** store: the suite opens several to
//! play independent clients (a second handle deletes a key behind a holder's
//! back, a fresh handle proves fences survive a new client). Each case uses
//! keys under its own random prefix, so cases run in parallel on one store.
//! The extensions a backend hands out select the optional cases; a case whose
//! capability is missing reports [`Outcome::Skipped`].
//!
//! # Skipped cases show as `ignored`
//!
//! libtest decides whether a test is ignored when the test is compiled, and a
//! backend's extensions ([`Backend::watcher`], …) are only known once it
//! runs. So the backend says at stamping time which optional
//! capabilities it lacks, and the macro stamps those cases
//! `#[ignore = "…"]`:
//!
//! ```text
//! moltlock_conformance::conformance_tests!(store(), without: [fair_queue, watch]);
//! ```
//!
//! `cargo test` then prints `test fair_queue_serves_in_arrival_order ... ignored,
//! the backend declares no fair queue` and counts the case in the summary's
//! `N ignored`. The list can never hide a case by mistake: the stamped test
//! `conformance_capabilities_match_stamping` fails when the backend declares a
//! capability the list says it lacks, and a case whose capability is missing
//! but not listed fails (it does not pass as `ok`). These are capability
//! skips, not a way to silence a failing case: a listed capability's cases
//! can only be skipped because the backend itself says it lacks them. The
//! names are [`Need`]'s: `watch`, `inspect`, `fair_queue`,
//! `raise_fence`, `describe`.
//!
//! # Timing
//!
//! Cases that wait and then assert run under a stall monitor ([`run_case`]):
//! a ticker measures how late the runtime wakes it. A case that fails while
//! the runtime stalled longer than [`STALL_LIMIT`], or that itself found a
//! sleep woke too late to judge (its message starts with
//! [`INCONCLUSIVE`]), or that failed on something load can cause (its
//! message starts with [`SLOW`]: the store did not answer in time, or a
//! liveness bound was missed), is run again, up to [`ATTEMPTS`] times. A case that
//! stays inconclusive fails with a message that says so: the suite never
//! passes a case it could not judge, and never blames a backend for a stall.
//! The self-tests hold every case to more: each broken backend must fail
//! its cases outright, not only as slow or inconclusive. A liveness case
//! tells the two apart by asking the store itself: it reads the end of a
//! hold the store reports, or probes the store while it waits, and blames
//! the store only when it answered every probe promptly.

pub mod broken;
pub mod cases;
mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{Backend, Error};

pub use support::{
    Bare, Delay, Duplicating, FencedResource, OverlapDetector, Partition, StallMonitor,
};

/// A boxed future, as the suite's functions return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type OpenFn = dyn Fn() -> BoxFuture<Result<Arc<dyn Backend>, Error>> + Send + Sync;
type CleanFn = dyn Fn(Vec<String>) -> BoxFuture<()> + Send + Sync;

/// Opens handles on the store under test.
#[derive(Clone)]
pub struct Factory {
    make: Arc<OpenFn>,
    clean: Option<Arc<CleanFn>>,
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

    /// Adds a cleanup, run after each case (passed or failed) with the
    /// keys the case made: every key it used, derived ones included,
    /// begins with one of them (cases make their keys on their own task,
    /// before spawning what uses them). For a store the tests share, it deletes
    /// what a backend keeps of a key after its release (a row kept for the
    /// key's fence, removed only by the backend's hourly sweep).
    #[must_use]
    pub fn with_cleanup<F, Fut>(mut self, clean: F) -> Self
    where
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.clean = Some(Arc::new(move |keys| Box::pin(clean(keys))));
        self
    }

    /// Runs the cleanup, if any, on the keys handed out on this thread.
    async fn clean_up(&self) {
        let keys = cases::take_keys();
        if let (Some(clean), false) = (&self.clean, keys.is_empty()) {
            clean(keys).await;
        }
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
        clean: None,
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
        clean: None,
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

/// An optional capability a case needs; a backend without it skips the case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    /// Release notifications ([`Backend::watcher`]).
    Watch,
    /// `inspect` and `list` ([`Backend::inspector`]).
    Inspect,
    /// The fair queue ([`Backend::fair_queue`]).
    FairQueue,
    /// Raising fences ([`Backend::fence_raiser`]).
    RaiseFence,
    /// Holder descriptions ([`Backend::describer`]).
    Describe,
    /// Taking several keys in one request ([`Backend::batch_cas`]).
    CasMulti,
    /// A delete that takes effect before the requests sent after it
    /// ([`moltlock_core::Limits::in_order`]).
    InOrder,
}

impl Need {
    /// Every optional capability.
    pub const ALL: [Need; 7] = [
        Need::Watch,
        Need::Inspect,
        Need::FairQueue,
        Need::RaiseFence,
        Need::Describe,
        Need::CasMulti,
        Need::InOrder,
    ];

    /// The name used in `conformance_tests!(…, without: [...])`, which is
    /// also the extension's name in [`moltlock_core::extension::extensions`]
    /// (`in_order` is a property of [`Backend::limits`], not an extension).
    pub fn name(self) -> &'static str {
        match self {
            Need::Watch => "watch",
            Need::Inspect => "inspect",
            Need::FairQueue => "fair_queue",
            Need::RaiseFence => "raise_fence",
            Need::Describe => "describe",
            Need::CasMulti => "cas_multi",
            Need::InOrder => "in_order",
        }
    }

    /// Whether `backend` hands out this extension.
    pub fn declared(self, backend: &dyn Backend) -> bool {
        match self {
            Need::Watch => backend.watcher().is_some(),
            Need::Inspect => backend.inspector().is_some(),
            Need::FairQueue => backend.fair_queue().is_some(),
            Need::RaiseFence => backend.fence_raiser().is_some(),
            Need::Describe => backend.describer().is_some(),
            Need::CasMulti => backend.batch_cas().is_some(),
            Need::InOrder => backend.limits().in_order,
        }
    }

    /// Why a case that needs this is skipped.
    pub fn missing(self) -> &'static str {
        match self {
            Need::Watch => "the backend declares no release notifications",
            Need::Inspect => "the backend declares no inspect/list",
            Need::FairQueue => "the backend declares no fair queue",
            Need::RaiseFence => "the backend declares no raise_fence",
            Need::Describe => "the backend declares no holder descriptions",
            Need::CasMulti => "the backend declares no cas_multi",
            Need::InOrder => "the backend does not declare its requests in order",
        }
    }
}

/// One case of the suite, by name.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name (also its test function's name).
    pub name: &'static str,
    /// The point of the lock contract (`docs/CONTRACT.md`) the case proves.
    pub point: &'static str,
    /// The optional capability the case needs, if any.
    pub needs: Option<Need>,
    /// Runs the case.
    pub run: fn(Factory) -> BoxFuture<CaseResult>,
}

/// The case named `name`, if the suite has one.
pub fn case_named(name: &str) -> Option<&'static Case> {
    cases::ALL.iter().find(|c| c.name == name)
}

/// The longest one attempt at a case may take before it counts as failed.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// A runtime stall longer than this during a failed attempt makes the
/// attempt inconclusive: the case is run again.
pub const STALL_LIMIT: Duration = Duration::from_millis(150);

/// How many attempts a case gets when its attempts are inconclusive.
pub const ATTEMPTS: u32 = 3;

/// The start of the message of a case that could not judge the backend
/// because the test itself was held up.
pub const INCONCLUSIVE: &str = "inconclusive: scheduler stall";

/// The start of the message of a case that failed on something a loaded
/// machine can cause: the store did not answer in time (a retryable store
/// error), or a bound on how *late* something may happen was missed. Such
/// a case is run again, like an inconclusive one; a real flaw fails every
/// attempt. Bounds on how *early* something may happen (safety) never
/// carry it.
pub const SLOW: &str = "slow store or machine";

/// Runs one case with the suite's time limit: skipped when the backend lacks
/// the capability the case needs; run again (up to [`ATTEMPTS`] times) when
/// an attempt was inconclusive (see the crate docs on timing).
pub async fn run_case(case: &Case, factory: Factory) -> CaseResult {
    if let Some(need) = case.needs {
        let b = factory.open().await?;
        if !need.declared(&*b) {
            return Ok(Outcome::Skipped(need.missing().to_owned()));
        }
    }
    let mut attempt = 1;
    loop {
        let monitor = StallMonitor::start();
        let result = match tokio::time::timeout(CASE_TIMEOUT, (case.run)(factory.clone())).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "{} did not finish within {CASE_TIMEOUT:?}",
                case.name
            )),
        };
        let stall = monitor.stop();
        let msg = match result {
            Err(msg) => msg,
            ok => return ok,
        };
        let inconclusive = msg.starts_with(INCONCLUSIVE) || msg.starts_with(SLOW);
        if !inconclusive && stall <= STALL_LIMIT {
            return Err(msg);
        }
        if attempt >= ATTEMPTS {
            if inconclusive {
                return Err(format!("{msg} (in each of {ATTEMPTS} attempts)"));
            }
            return Err(format!(
                "{msg} (the runtime stalled up to {stall:?} during the attempt)"
            ));
        }
        attempt += 1;
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

/// Runs every case, at most `parallel` at once, and returns each result in
/// the order of [`cases::ALL`].
pub async fn run_all_parallel(
    factory: Factory,
    parallel: usize,
) -> Vec<(&'static str, CaseResult)> {
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = Vec::new();
    for case in cases::ALL {
        let (gate, factory) = (gate.clone(), factory.clone());
        tasks.push((
            case.name,
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await;
                run_case(case, factory).await
            }),
        ));
    }
    let mut out = Vec::new();
    for (name, task) in tasks {
        let r = match task.await {
            Ok(r) => r,
            Err(e) => Err(format!("the case panicked: {e}")),
        };
        out.push((name, r));
    }
    out
}

/// Runs a case in a test and panics with its message if it failed. A case
/// skipped here panics too: the macro stamps cases of capabilities a
/// backend lacks as ignored, so a skip that reaches this point is a
/// capability missing from the stamping's `without:` list.
pub async fn assert_case(case: &Case, factory: Factory) {
    let result = run_case(case, factory.clone()).await;
    factory.clean_up().await;
    match result {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::Skipped(why)) => {
            let cap = case.needs.map_or("?", Need::name);
            panic!(
                "conformance case {} cannot run: {why}; stamp the suite with \
                 `conformance_tests!(factory, without: [{cap}])` so cargo test reports it as ignored",
                case.name
            )
        }
        Err(msg) => panic!("conformance case {} failed: {msg}", case.name),
    }
}

/// Runs a case stamped as ignored (only with `cargo test -- --ignored`): a
/// skip is reported and passes, a failure panics.
pub async fn assert_case_or_skip(case: &Case, factory: Factory) {
    let result = run_case(case, factory.clone()).await;
    factory.clean_up().await;
    match result {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::Skipped(why)) => println!("{}: skipped: {why}", case.name),
        Err(msg) => panic!("conformance case {} failed: {msg}", case.name),
    }
}

/// Checks a `without:` list against the capabilities the backend declares.
///
/// # Errors
/// A message naming each capability the list and the backend disagree on.
pub async fn check_stamping(factory: Factory, without: &[&str]) -> Result<(), String> {
    let b = factory.open().await?;
    let mut wrong = Vec::new();
    for need in Need::ALL {
        let listed = without.contains(&need.name());
        if listed && need.declared(&*b) {
            wrong.push(format!(
                "the backend declares {} but the suite was stamped without it, so its cases never run",
                need.name()
            ));
        }
        if !listed && !need.declared(&*b) {
            wrong.push(format!(
                "{}: add {} to the `without:` list so its cases show as ignored",
                need.missing(),
                need.name()
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Stamps every conformance case into a `#[tokio::test]` for the factory
/// expression given (evaluated once per test). The calling crate needs
/// `tokio` (with `macros` and `rt-multi-thread`) as a dev-dependency.
///
/// `conformance_tests!(factory)` is for a backend with every optional
/// capability; `conformance_tests!(factory, without: [fair_queue, ...])`
/// names those it lacks, whose cases are stamped `#[ignore]` (see the crate
/// docs). The case names come from the suite's one list of cases, so a
/// new case is stamped everywhere at once. Besides the cases it stamps
/// `conformance_capabilities_match_stamping`.
#[macro_export]
macro_rules! conformance_tests {
    (@known watch) => {};
    (@known inspect) => {};
    (@known fair_queue) => {};
    (@known raise_fence) => {};
    (@known describe) => {};
    (@known cas_multi) => {};
    (@known in_order) => {};
    (@known $other:ident) => {
        compile_error!(concat!(
            "conformance_tests!: unknown capability `", stringify!($other),
            "`; the optional ones are watch, inspect, fair_queue, raise_fence, describe, cas_multi and in_order"
        ));
    };
    (@gate $f:expr; watch; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find watch; [$($w)*];
            { @ignored $f; "the backend declares no release notifications"; $names };
            { @run $f; $names });
    };
    (@gate $f:expr; inspect; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find inspect; [$($w)*];
            { @ignored $f; "the backend declares no inspect/list"; $names };
            { @run $f; $names });
    };
    (@gate $f:expr; fair_queue; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find fair_queue; [$($w)*];
            { @ignored $f; "the backend declares no fair queue"; $names };
            { @run $f; $names });
    };
    (@gate $f:expr; raise_fence; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find raise_fence; [$($w)*];
            { @ignored $f; "the backend declares no raise_fence"; $names };
            { @run $f; $names });
    };
    (@gate $f:expr; describe; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find describe; [$($w)*];
            { @ignored $f; "the backend declares no holder descriptions"; $names };
            { @run $f; $names });
    };
    (@gate $f:expr; cas_multi; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find cas_multi; [$($w)*];
            { @ignored $f; "the backend declares no cas_multi"; $names };
            { @run $f; $names });
    };
    (@gate $f:expr; in_order; [$($w:ident)*]; $names:tt) => {
        $crate::conformance_tests!(@find in_order; [$($w)*];
            { @ignored $f; "the backend does not declare its requests in order"; $names };
            { @run $f; $names });
    };
    (@find watch; [watch $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find inspect; [inspect $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find fair_queue; [fair_queue $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find raise_fence; [raise_fence $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find describe; [describe $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find cas_multi; [cas_multi $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find in_order; [in_order $($r:ident)*]; {$($yes:tt)*}; $no:tt) => {
        $crate::conformance_tests!($($yes)*);
    };
    (@find $cap:ident; [$other:ident $($r:ident)*]; $yes:tt; $no:tt) => {
        $crate::conformance_tests!(@find $cap; [$($r)*]; $yes; $no);
    };
    (@find $cap:ident; []; $yes:tt; {$($no:tt)*}) => {
        $crate::conformance_tests!($($no)*);
    };
    (@run $f:expr; [$($name:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let factory: $crate::Factory = $f;
                match $crate::case_named(stringify!($name)) {
                    Some(case) => $crate::assert_case(case, factory).await,
                    None => panic!("the suite has no case {}", stringify!($name)),
                }
            }
        )*
    };
    (@ignored $f:expr; $why:literal; [$($name:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $why]
            async fn $name() {
                let factory: $crate::Factory = $f;
                match $crate::case_named(stringify!($name)) {
                    Some(case) => $crate::assert_case_or_skip(case, factory).await,
                    None => panic!("the suite has no case {}", stringify!($name)),
                }
            }
        )*
    };
    (@stamp $f:expr; $caps:tt; $($group:ident: [$($name:ident: $point:literal,)*],)*) => {
        $( $crate::conformance_tests!(@group $f; $group; $caps; [$($name),*]); )*
    };
    (@group $f:expr; always; $caps:tt; $names:tt) => {
        $crate::conformance_tests!(@run $f; $names);
    };
    (@group $f:expr; $group:ident; $caps:tt; $names:tt) => {
        $crate::conformance_tests!(@gate $f; $group; $caps; $names);
    };
    ($factory:expr, without: [$($cap:ident),* $(,)?] $(,)?) => {
        $( $crate::conformance_tests!(@known $cap); )*
        $crate::__cases!($crate::conformance_tests; @stamp $factory; [$($cap)*]);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn conformance_capabilities_match_stamping() {
            let factory: $crate::Factory = $factory;
            if let Err(msg) = $crate::check_stamping(factory, &[$(stringify!($cap)),*]).await {
                panic!("{msg}");
            }
        }
    };
    ($factory:expr $(,)?) => {
        $crate::conformance_tests!($factory, without: []);
    };
}
