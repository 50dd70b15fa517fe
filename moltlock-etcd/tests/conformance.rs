//! The full conformance suite against one etcd (a fresh server per test, or
//! the one `MOLTLOCK_ETCD_URL` names). Each factory call opens a new client
//! (a new session) on the same server.

use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::etcd::etcd;

fn store() -> moltlock_conformance::Factory {
    moltlock_fixtures::conformance_factory(etcd(), |etcd| async move {
        EtcdBackend::connect(EtcdConfig::new(etcd.endpoints.clone())).await
    })
}

moltlock_conformance::conformance_tests!(store(), without: [in_order]);
