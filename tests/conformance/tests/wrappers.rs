//! Every in-tree wrapper exposes exactly the extensions of what it wraps:
//! no more (a feature it would then fail to provide) and no fewer (a
//! feature it would silently drop).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::Arc;
use std::time::Duration;

use moltlock_conformance::broken::{Flaw, Flawed};
use moltlock_conformance::{Bare, Delay, Duplicating, Partition};
use moltlock_core::extension::extensions;
use moltlock_core::{Backend, Error, MemoryBackend, MigratingBackend, Phase};

/// Stores with every mix the suite has: all extensions (a fair queue too),
/// all but the fair queue, none.
fn inners() -> Vec<Arc<dyn Backend>> {
    vec![
        Arc::new(Flawed::new(Flaw::None)),
        Arc::new(MemoryBackend::new()),
        Arc::new(Bare::default()),
    ]
}

fn wrapped(inner: &Arc<dyn Backend>) -> Vec<(&'static str, Box<dyn Backend>)> {
    let d = Duration::ZERO;
    vec![
        ("Partition", Box::new(Partition::new(inner.clone()))),
        ("Delay", Box::new(Delay::new(inner.clone(), d, d))),
        ("Duplicating", Box::new(Duplicating::new(inner.clone()))),
        ("Arc", Box::new(inner.clone())),
        ("Box", Box::new(Box::new(inner.clone()))),
    ]
}

#[test]
fn wrappers_expose_exactly_the_extensions_they_wrap() {
    let names: Vec<Vec<&str>> = inners().iter().map(|b| extensions(&**b)).collect();
    assert_eq!(names[0].len(), 7, "the flawed store has every extension");
    assert!(names[2].is_empty(), "the bare store has none");
    for inner in inners() {
        let want = extensions(&*inner);
        for (name, wrapper) in wrapped(&inner) {
            assert_eq!(extensions(&*wrapper), want, "{name} over {}", inner.name());
            assert_eq!(wrapper.limits(), inner.limits(), "{name} limits");
            assert_eq!(wrapper.name(), inner.name(), "{name} name");
        }
    }
}

/// A backend that raises fences, as a migration needs, and nothing else.
fn raising() -> Vec<Arc<dyn Backend>> {
    vec![
        Arc::new(Flawed::new(Flaw::None)),
        Arc::new(MemoryBackend::new()),
    ]
}

#[test]
fn migration_in_a_single_phase_is_the_deciding_store() {
    for old in raising() {
        for new in raising() {
            let (o, n) = (extensions(&*old), extensions(&*new));
            let phase = |p| MigratingBackend::new(old.clone(), new.clone(), p).unwrap();
            assert_eq!(extensions(&phase(Phase::Old)), o);
            assert_eq!(extensions(&phase(Phase::New)), n);
            let both = extensions(&phase(Phase::Both));
            assert!(
                !both.contains(&"fair_queue"),
                "two queues have no one order"
            );
            assert!(
                !both.contains(&"cas_multi"),
                "in both phases each key is taken on both stores, one cas at a time"
            );
            assert!(both.contains(&"raise_fence"));
        }
    }
}

#[test]
fn migration_refuses_a_store_that_cannot_raise_fences() {
    let bare: Arc<dyn Backend> = Arc::new(Bare::default());
    let memory: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let res = MigratingBackend::new(memory, bare, Phase::Old);
    assert!(matches!(res, Err(Error::Config(_))), "{res:?}");
}
