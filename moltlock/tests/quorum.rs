//! The whole conformance suite over a real mixed quorum: etcd, Postgres and
//! Redis, by one `quorum:` URL.
#![cfg(all(feature = "etcd", feature = "postgres", feature = "redis"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // fixtures unwrap

use std::sync::OnceLock;

/// The quorum URL over three servers that live as long as the test binary
/// (kept by a thread of their own, not by the test that started them).
fn url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let etcd = moltlock_fixtures::keep_alive(|| {
            let etcd = moltlock_fixtures::etcd::etcd()?;
            Ok((etcd.url(), etcd))
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let redis = moltlock_fixtures::keep_alive(|| {
            let redis = moltlock_fixtures::redis::redis()?;
            Ok((redis.url(), redis))
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let pg = moltlock_fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
        let prefix = moltlock_fixtures::redis::unique_prefix();
        let sep = if redis.contains('?') { '&' } else { '?' };
        format!("quorum:{etcd}|{pg}|{redis}{sep}key_prefix={prefix}")
    })
    .clone()
}

/// The quorum's Postgres member keeps a row of each released key on the
/// shared server: each case's rows are deleted after it.
fn mixed() -> moltlock_conformance::Factory {
    let url = url();
    moltlock_conformance::factory(move || {
        let url = url.clone();
        async move { moltlock::connect(&url).await }
    })
    .with_cleanup(moltlock_fixtures::rows::cleanup(
        moltlock_fixtures::postgres::shared_url(),
    ))
}

moltlock_conformance::conformance_tests!(
    mixed(),
    without: [watch, fair_queue, cas_multi, in_order]
);

#[tokio::test]
async fn the_quorum_url_names_three_members() {
    let members = moltlock::parse_quorum(&url()).unwrap().unwrap();
    assert_eq!(members.len(), 3);
    let backend = moltlock::connect(&url()).await.unwrap();
    assert_eq!(backend.name(), "quorum");
}
