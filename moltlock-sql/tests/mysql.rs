//! MySQL/MariaDB: the conformance suite against `MOLTLOCK_MYSQL_URL`.

use moltlock_core::Error;
use moltlock_sql::{MySqlBackend, SqlConfig};

fn url() -> Result<String, Error> {
    std::env::var("MOLTLOCK_MYSQL_URL").map_err(|_| {
        Error::Config(
            "set MOLTLOCK_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to a MySQL or \
             MariaDB the tests may use"
                .into(),
        )
    })
}

fn mysql() -> moltlock_conformance::Factory {
    moltlock_conformance::factory(|| async { MySqlBackend::connect(&url()?).await })
}

moltlock_conformance::conformance_tests!(mysql(), without: [notifies_release, fair_queue]);

#[tokio::test]
async fn table_names_are_validated() {
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let res = MySqlBackend::with_config(SqlConfig::new(&url).table("x`; DROP TABLE y")).await;
    assert!(matches!(res, Err(Error::Config(_))), "{res:?}");
}

#[tokio::test]
async fn wrong_password_is_an_auth_error() {
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let bad = url.replacen("root@", "root:definitely-wrong@", 1);
    let res = MySqlBackend::connect(&bad).await;
    assert!(matches!(res, Err(Error::Auth { .. })), "{res:?}");
}

/// Two thousand holds of one manager stay held across several TTLs: renewal
/// is batched, so it keeps up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_holds_stay_renewed() {
    use std::time::Duration;
    let url = url().unwrap_or_else(|e| panic!("{e}"));
    let backend = MySqlBackend::connect(&url).await.unwrap();
    let manager = moltlock_core::LockManager::builder(backend)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let prefix = format!("many/{}", moltlock_core::Token::random());
    let mut guards = Vec::new();
    for i in 0..2000 {
        guards.push(manager.lock(format!("{prefix}/{i}")).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 2000 holds were lost");
    assert_eq!(manager.held_count(), 2000);
}
