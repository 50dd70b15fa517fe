//! The core of one backend instance: everything its operations share. The
//! operations themselves live in files named for their jobs: `holds.rs`
//! (acquire, renew, hand over, release, describe, raise the fence),
//! `renew.rs` (batch renewal), `multi.rs` (several keys in one Txn),
//! `inspect.rs` (reading holds) and `fair.rs`
//! (the fair queue); `backend.rs` only hands them out as a
//! [`Backend`](moltlock_core::Backend).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use moltlock_core::Error;

use crate::config::EtcdConfig;
use crate::error::{call, map, timed_out};
use crate::keys::Keys;
use crate::pending::Pending;
use crate::session::Session;
use crate::txn::Transport;
use crate::watch::WatchHub;
use crate::written::Written;

/// One session's shared state.
pub(crate) struct Core {
    /// Where each key lives.
    pub(crate) keys: Keys,
    /// Requests to etcd.
    pub(crate) io: Transport,
    /// The leases holds hang on.
    pub(crate) session: Session,
    /// The shortest TTL accepted (the session TTL).
    pub(crate) min_ttl: Duration,
    /// How many times a waiter was woken by a watch event.
    pub(crate) wakeups: Arc<AtomicU64>,
    /// The one watch stream every waiter of this backend shares.
    pub(crate) watches: Arc<WatchHub>,
    /// Owner-checked deletes not yet confirmed.
    pub(crate) pending: Pending,
    /// The tokens this session's confirmed writes left on each key.
    pub(crate) written: Written,
    /// The server's most operations per list of one Txn.
    pub(crate) max_txn_ops: usize,
}

impl Core {
    /// Checks `config`, connects, and checks that etcd answers.
    pub(crate) async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        let opts = config.connect_options()?;
        let dial = config.connect_timeout;
        let connecting = Client::connect(&config.endpoints, Some(opts));
        let client = match tokio::time::timeout(dial, connecting).await {
            Ok(r) => r.map_err(map)?,
            Err(_) => return Err(timed_out("connecting", dial)),
        };
        let mut probe = client.clone();
        let opts = GetOptions::new().with_count_only();
        let within = dial + config.request_timeout;
        let first = probe.get(config.key_prefix.clone(), Some(opts));
        call("the first request", within, first).await?;
        Self::over(client, config)
    }

    /// The core of a session over `client`, with `config`'s key prefix,
    /// session TTL and request timeout, once they are checked.
    pub(crate) fn over(client: Client, config: EtcdConfig) -> Result<Self, Error> {
        config.validate_session()?;
        Ok(Self::new(client, config))
    }

    fn new(client: Client, config: EtcdConfig) -> Self {
        let timeout = config.request_timeout;
        Self {
            keys: Keys::new(config.key_prefix),
            session: Session::new(client.clone(), config.session_ttl, timeout),
            watches: Arc::new(WatchHub::new(client.clone(), timeout)),
            io: Transport::new(client, timeout),
            min_ttl: config.session_ttl,
            wakeups: Arc::new(AtomicU64::new(0)),
            pending: Pending::default(),
            written: Written::default(),
            max_txn_ops: config.max_txn_ops,
        }
    }
}
