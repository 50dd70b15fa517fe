//! The full conformance suite against one etcd (a fresh server per test, or
//! the one `MOLTLOCK_ETCD_URL` names). Each factory call opens a new client
//! (a new session) on the same server.

use std::sync::Arc;

use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::{etcd, Etcd};

fn store() -> moltlock_conformance::Factory {
    let server: Arc<Result<Etcd, String>> = Arc::new(etcd());
    moltlock_conformance::factory(move || {
        let server = server.clone();
        async move {
            let etcd = match server.as_ref() {
                Ok(e) => e,
                Err(msg) => return Err(moltlock_core::Error::Config(msg.clone())),
            };
            let cfg = EtcdConfig::builder(etcd.endpoints.clone()).build()?;
            EtcdBackend::connect(cfg).await
        }
    })
}

moltlock_conformance::conformance_tests!(store());
