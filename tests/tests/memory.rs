//! The whole conformance suite against the in-memory reference backend.

use moltlock_core::MemoryBackend;

fn memory() -> moltlock_conformance::Factory {
    let shared = MemoryBackend::new();
    moltlock_conformance::factory(move || {
        let b = shared.clone();
        async move { Ok(b) }
    })
}

moltlock_conformance::conformance_tests!(memory());

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

    moltlock_conformance::conformance_tests!(both());
}
