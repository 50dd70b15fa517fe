//! The transport: every request to etcd's KV and lease services goes out
//! here, with the request timeout, and the helpers that read Txn answers.

use std::time::Duration;

use etcd_client::{
    Client, GetOptions, GetResponse, KeyValue, LeaseTimeToLiveOptions, LeaseTimeToLiveResponse,
    Txn, TxnOpResponse, TxnResponse,
};
use moltlock_core::{Error, Fence, Held, Token};

use crate::error::{call, NAME};

/// One etcd client and the request timeout every request gets.
pub(crate) struct Transport {
    /// The client (cheap to clone: clones share the connection).
    pub(crate) client: Client,
    /// The timeout of every request.
    pub(crate) timeout: Duration,
}

impl Transport {
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        Self { client, timeout }
    }

    /// Sends `txn`. The error stays etcd's, so callers can tell a lease
    /// that is gone from other failures.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse, etcd_client::Error> {
        let mut kv = self.client.kv_client();
        match tokio::time::timeout(self.timeout, kv.txn(txn)).await {
            Ok(r) => r,
            Err(_) => Err(etcd_client::Error::GRpcStatus(
                tonic::Status::deadline_exceeded("txn did not answer within the request timeout"),
            )),
        }
    }

    /// The time left on `lease`, with the keys attached to it if `keys`.
    pub(crate) async fn lease_ttl(
        &self,
        lease: i64,
        keys: bool,
    ) -> Result<LeaseTimeToLiveResponse, Error> {
        let opts = keys.then(|| LeaseTimeToLiveOptions::new().with_keys());
        let mut client = self.client.clone();
        call(
            "lease time-to-live",
            self.timeout,
            client.lease_time_to_live(lease, opts),
        )
        .await
    }

    /// One range read.
    pub(crate) async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, Error> {
        let mut client = self.client.clone();
        call("get", self.timeout, client.get(key, opts)).await
    }
}

/// The revision in a Txn answer's header.
pub(crate) fn header_revision(resp: &TxnResponse) -> Result<i64, Error> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| Error::store(NAME, "a Txn answer had no header", true))
}

/// A revision as a fence; etcd's revisions start at 1.
pub(crate) fn fence(revision: i64) -> Result<Fence, Error> {
    u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .map(Fence)
        .ok_or_else(|| Error::store(NAME, format!("etcd reported revision {revision}"), true))
}

/// `fence` lifted by a key's fence offset, as every reported fence is.
pub(crate) fn offset_fence(fence: Fence, offset: i64) -> Fence {
    Fence(fence.get().saturating_add(offset.unsigned_abs()))
}

/// The fence offset read by the Txn's `index`-th operation (0 if none).
pub(crate) fn offset_in(resp: &TxnResponse, index: usize) -> i64 {
    match resp.op_responses().get(index) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map_or(0, |kv| parse_offset(kv.value())),
        _ => 0,
    }
}

/// A stored fence offset (0 if unreadable).
pub(crate) fn parse_offset(value: &[u8]) -> i64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The first key-value of the first Get answer of a Txn.
pub(crate) fn first_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    })
}

/// What a failed Txn saw: the holder (from its Get) and the header revision.
pub(crate) fn held(resp: &TxnResponse) -> Held {
    Held {
        holder: first_kv(resp).map(|kv| Token::from_stored(String::from_utf8_lossy(kv.value()))),
        expires_in: None,
        revision: resp.header().and_then(|h| u64::try_from(h.revision()).ok()),
    }
}
