//! The file backend passes the whole conformance suite.

use std::sync::Arc;

use moltlock_example_file_backend::FileBackend;

fn files() -> moltlock_conformance::Factory {
    let dir = Arc::new(tempfile::tempdir().map_err(|e| e.to_string()));
    moltlock_conformance::factory(move || {
        let dir = dir.clone();
        async move {
            let path = match dir.as_ref() {
                Ok(d) => d.path().to_owned(),
                Err(e) => return Err(moltlock_core::Error::Config(e.clone())),
            };
            FileBackend::new(path)
        }
    })
}

moltlock_conformance::conformance_tests!(
    files(),
    without: [watch, inspect, fair_queue, raise_fence, describe, cas_multi, in_order]
);
