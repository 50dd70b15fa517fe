//! Connections: a self-reconnecting command connection (the client's
//! `ConnectionManager`, or its async cluster connection) and plain clients
//! for the pub/sub connection.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, ClientTlsConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, ProtocolVersion,
    RedisConnectionInfo, RedisFuture, TlsCertificates, Value,
};

use moltlock_core::Error;

use crate::config::{Mode, RedisConfig};
use crate::error::{map, timed_out};

/// The command connection; cheap to clone (clones share one connection).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server, reconnecting by itself.
    Single(ConnectionManager),
    /// A cluster, routing each command to its slot's primary.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection info of each configured node.
fn node_infos(cfg: &RedisConfig) -> Vec<ConnectionInfo> {
    cfg.nodes
        .iter()
        .map(|(host, port)| ConnectionInfo {
            addr: if cfg.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            },
            redis: RedisConnectionInfo {
                db: cfg.database,
                username: cfg.username.clone(),
                password: cfg.password.as_ref().map(|p| p.expose().to_owned()),
                protocol: ProtocolVersion::RESP2,
            },
        })
        .collect()
}

fn certificates(cfg: &RedisConfig) -> Option<TlsCertificates> {
    let files = &cfg.tls_files;
    if files.ca_cert_pem.is_none() && files.client_cert_pem.is_none() {
        return None;
    }
    Some(TlsCertificates {
        client_tls: files
            .client_cert_pem
            .as_ref()
            .map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.expose().as_bytes().to_vec(),
            }),
        root_cert: files.ca_cert_pem.clone(),
    })
}

/// rustls needs one process-wide crypto provider; installs ring's unless
/// the application installed one already.
fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// One plain client per configured node (for single mode, pub/sub, and
/// cluster seeds).
pub(crate) fn clients(cfg: &RedisConfig) -> Result<Vec<Client>, Error> {
    if cfg.tls {
        ensure_crypto_provider();
    }
    node_infos(cfg)
        .into_iter()
        .map(|info| match certificates(cfg) {
            Some(certs) if cfg.tls => Client::build_with_tls(info, certs),
            _ => Client::open(info),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(map)
}

/// Opens the command connection.
pub(crate) async fn connect(cfg: &RedisConfig, clients: &[Client]) -> Result<Conn, Error> {
    let open = async {
        match cfg.mode {
            Mode::Single => single(cfg, clients).await,
            Mode::Cluster => cluster(cfg, clients).await,
        }
    };
    tokio::time::timeout(cfg.connect_timeout, open)
        .await
        .map_err(|_| timed_out("connecting to Redis"))?
}

async fn single(cfg: &RedisConfig, clients: &[Client]) -> Result<Conn, Error> {
    let client = clients
        .first()
        .ok_or_else(|| Error::Config("no Redis node given".into()))?
        .clone();
    // No response timeout of the client's own: every request is bounded
    // by the backend's (`RedisBackend::timed`), and a second timer per
    // request costs a timer registration, and at times the wake of a
    // parked worker thread to re-arm the runtime's timer, on every lock
    // and release. A timed-out response never made the client reconnect
    // either way.
    let manager_cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(cfg.connect_timeout)
        .set_number_of_retries(2)
        .set_max_delay(500);
    let manager = ConnectionManager::new_with_config(client, manager_cfg)
        .await
        .map_err(map)?;
    Ok(Conn::Single(manager))
}

async fn cluster(cfg: &RedisConfig, clients: &[Client]) -> Result<Conn, Error> {
    let seeds: Vec<ConnectionInfo> = clients
        .iter()
        .map(|c| c.get_connection_info().clone())
        .collect();
    let mut builder = ClusterClient::builder(seeds)
        .connection_timeout(cfg.connect_timeout)
        .response_timeout(cfg.request_timeout)
        .retries(3);
    if let Some(user) = &cfg.username {
        builder = builder.username(user.clone());
    }
    if let Some(pw) = &cfg.password {
        builder = builder.password(pw.expose().to_owned());
    }
    if cfg.tls {
        builder = builder.tls(redis::TlsMode::Secure);
        if let Some(certs) = certificates(cfg) {
            builder = builder.certs(certs);
        }
    }
    let client = builder.build().map_err(map)?;
    let conn = client.get_async_connection().await.map_err(map)?;
    Ok(Conn::Cluster(conn))
}

/// The command connection of the application's own cluster client.
pub(crate) async fn cluster_of(cfg: &RedisConfig, client: &ClusterClient) -> Result<Conn, Error> {
    let conn = tokio::time::timeout(cfg.connect_timeout, client.get_async_connection())
        .await
        .map_err(|_| timed_out("connecting to the Redis Cluster"))?
        .map_err(map)?;
    Ok(Conn::Cluster(conn))
}
