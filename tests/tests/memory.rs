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
