//! The full conformance suite against one etcd (a fresh server per test, or
//! the one `MOLTLOCK_ETCD_URL` names). Each factory call opens a new client
//! (a new session) on the same server.

use std::sync::Arc;

use moltlock_conformance::fixtures::etcd::{etcd, Etcd};
use moltlock_etcd::{EtcdBackend, EtcdConfig};

fn store() -> moltlock_conformance::Factory {
    let server: Arc<Result<Etcd, String>> = Arc::new(etcd());
    moltlock_conformance::factory(move || {
        let server = server.clone();
        async move {
            let etcd = match server.as_ref() {
                Ok(e) => e,
                Err(msg) => return Err(moltlock_core::Error::Config(msg.clone())),
            };
            EtcdBackend::connect(EtcdConfig::new(etcd.endpoints.clone())).await
        }
    })
}

moltlock_conformance::conformance_tests!(store());
