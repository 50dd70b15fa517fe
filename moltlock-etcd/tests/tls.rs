//! etcd with client TLS and auth: a correct configuration works; a wrong
//! password is a clear `Error::Auth`.

use std::time::Duration;

use moltlock_core::{Error, LockManager};
use moltlock_etcd::{EtcdBackend, EtcdConfig};
use moltlock_fixtures::certs::{self, TestCerts};
use moltlock_fixtures::etcd::start_tls;

fn tls_config(endpoint: &str, certs: &TestCerts) -> EtcdConfig {
    EtcdConfig::new([endpoint.to_owned()])
        .tls_ca_file(certs.ca())
        .tls_client_files(certs.client_cert(), certs.client_key())
        .tls_domain("localhost")
        .connect_timeout(Duration::from_secs(3))
}

async fn enable_auth(endpoint: &str, certs: &TestCerts) -> Result<(), Box<dyn std::error::Error>> {
    let admin = EtcdBackend::connect(tls_config(endpoint, certs)).await?;
    let mut c = admin.client().clone();
    c.user_add("root", "root-secret", None).await?;
    c.role_add("root").await?;
    c.user_grant_role("root", "root").await?;
    c.auth_enable().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_auth() -> Result<(), Box<dyn std::error::Error>> {
    let certs = certs::make()?;
    let server = start_tls(&certs)?;
    let ep = server.endpoint();
    enable_auth(&ep, &certs).await?;

    let good = tls_config(&ep, &certs).auth("root", "root-secret");
    let m = LockManager::builder(EtcdBackend::connect(good).await?)
        .ttl(Duration::from_secs(5))
        .build()?;
    let g = m.lock("tls/locked").await?;
    assert!(g.is_held());
    assert!(m.try_lock("tls/locked").await?.is_none());
    g.release().await?;

    let wrong = tls_config(&ep, &certs).auth("root", "wrong");
    match EtcdBackend::connect(wrong).await {
        Err(e @ Error::Auth { .. }) => {
            assert!(e.to_string().contains("authentication failed"), "{e}");
            // The client's own error is the source, for callers that need it.
            let source =
                std::error::Error::source(&e).and_then(|s| s.downcast_ref::<etcd_client::Error>());
            assert!(
                matches!(source, Some(etcd_client::Error::GRpcStatus(s)) if s.message().contains("authentication failed")),
                "the source is not etcd's error: {source:?}"
            );
        }
        other => panic!("expected Error::Auth, got {other:?}"),
    }

    let url = format!(
        "etcds://root:root-secret@{ep}/tls-url?ca={}&cert={}&key={}&domain=localhost",
        certs.ca().display(),
        certs.client_cert().display(),
        certs.client_key().display()
    );
    let m = LockManager::new(EtcdBackend::from_url(&url).await?);
    m.lock("tls/url").await?.release().await?;

    let plain = EtcdConfig::new([ep.clone()]).connect_timeout(Duration::from_secs(1));
    assert!(
        EtcdBackend::connect(plain).await.is_err(),
        "plain text reached a TLS-only server"
    );
    Ok(())
}
