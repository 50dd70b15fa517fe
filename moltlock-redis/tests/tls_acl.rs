//! TLS and ACL: a TLS-only `redis-server` this test owns, with certificates
//! made for the test and an ACL user limited to what the backend needs.

use moltlock_core::{Backend, Error, LockKey, Token};
use moltlock_fixtures::redis as fx;
use moltlock_redis::{RedisBackend, RedisConfig};

/// The commands, keys and channels the backend needs, and nothing else.
const LOCKER_ACL: &[&str] = &[
    "locker",
    "on",
    ">locker-pw",
    "resetkeys",
    "~moltlock:*",
    "resetchannels",
    "&moltlock:{*",
    "-@all",
    "+eval",
    "+evalsha",
    "+get",
    "+mget",
    "+set",
    "+del",
    "+pexpire",
    "+pttl",
    "+time",
    "+lastsave",
    "+info",
    "+publish",
    "+psubscribe",
    "+scan",
    "+ping",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zscore",
    "+sadd",
    "+spop",
    "+srem",
];

fn acl_args() -> Vec<String> {
    let mut args = vec!["--user".to_string()];
    args.extend(
        ["default", "on", ">admin-pw", "~*", "&*", "+@all"]
            .iter()
            .map(|s| s.to_string()),
    );
    args.push("--user".into());
    args.extend(LOCKER_ACL.iter().map(|s| s.to_string()));
    args
}

fn start() -> Result<fx::TlsRedis, String> {
    fx::start_tls(&acl_args())
}

fn config(server: &fx::TlsRedis, user: &str, pw: &str) -> Result<RedisConfig, Error> {
    Ok(RedisConfig::from_url(&server.redis.url())?
        .username(user)
        .password(pw)
        .tls_ca_cert_pem(server.tls.ca_pem.clone()))
}

fn tls_store() -> moltlock_conformance::Factory {
    moltlock_fixtures::conformance_factory(start(), |s| async move {
        RedisBackend::connect(config(&s, "locker", "locker-pw")?).await
    })
}

/// The whole suite over TLS as the restricted ACL user.
mod conformance_over_tls_as_acl_user {
    use super::tls_store;
    moltlock_conformance::conformance_tests!(tls_store());
}

#[tokio::test]
async fn wrong_password_is_auth_error() -> Result<(), Box<dyn std::error::Error>> {
    let server = start()?;
    let err = RedisBackend::connect(config(&server, "locker", "not-the-password")?)
        .await
        .err()
        .ok_or("connected with a wrong password")?;
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");
    Ok(())
}

#[tokio::test]
async fn keys_outside_the_acl_are_auth_errors() -> Result<(), Box<dyn std::error::Error>> {
    let server = start()?;
    let cfg = RedisConfig::from_url(&server.redis.url())?
        .username("locker")
        .password("locker-pw")
        .key_prefix("elsewhere:")
        .tls_ca_cert_pem(server.tls.ca_pem.clone());
    let backend = RedisBackend::connect(cfg).await?;
    let err = backend
        .cas(
            &LockKey::new("k")?,
            None,
            &Token::random(),
            std::time::Duration::from_secs(1),
        )
        .await
        .err()
        .ok_or("wrote outside the ACL key pattern")?;
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn untrusted_certificate_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let server = start()?;
    let other = moltlock_fixtures::certs::make()?;
    let cfg = RedisConfig::from_url(&server.redis.url())?
        .username("locker")
        .password("locker-pw")
        .tls_ca_cert_pem(other.ca_pem.clone());
    let err = RedisBackend::connect(cfg).await.err();
    assert!(err.is_some(), "trusted a certificate from an unknown CA");
    Ok(())
}

/// The commands the scripts call, read from their sources.
fn script_commands() -> Vec<String> {
    let sources = [
        include_str!("../src/scripts.rs"),
        include_str!("../src/fair.rs"),
    ];
    let mut found: Vec<String> = sources
        .iter()
        .flat_map(|src| src.split("redis.call('").skip(1))
        .filter_map(|rest| rest.split('\'').next())
        .map(str::to_ascii_uppercase)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// A command a script calls but the ACL list (here and in the crate docs)
/// leaves out fails every lock of a restricted user: the list must name
/// each one.
#[test]
fn the_acl_list_names_every_command_the_scripts_call() {
    let commands = script_commands();
    assert!(commands.len() > 10, "found too few commands: {commands:?}");
    let docs = include_str!("../src/lib.rs");
    for command in commands {
        let rule = format!("+{}", command.to_ascii_lowercase());
        assert!(LOCKER_ACL.contains(&rule.as_str()), "test ACL lacks {rule}");
        assert!(
            docs.contains(&format!("`{command}`")),
            "docs lack {command}"
        );
    }
}
