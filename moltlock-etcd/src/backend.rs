//! [`EtcdBackend`]: the `Backend` implementation over etcd v3.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, LeaseTimeToLiveOptions,
    PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use moltlock_core::{
    async_trait, Backend, CasOutcome, Describe, Error, FairQueue, Fence, Held, HolderInfo, Inspect,
    Limits, LockKey, RaiseFence, ReleaseWatch, RenewItem, RenewMany, Token, Watch,
};
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::error::{call, is_lease_not_found, map, timed_out, NAME};
use crate::session::Session;
use crate::watch::{KeyWatch, WatchHub};

/// etcd's default limit of operations in one Txn is 128; batches stay below.
const TXN_CHUNK: usize = 100;

/// Marks queue entries: `<prefix><key>` + this + `<token>`. Lock keys never
/// contain control characters, so no lock key can collide with a queue entry.
pub(crate) const QUEUE_MARK: &str = "\u{0}queue/";
/// Marks the key holding a lock's fence offset (see [`Shared::offset_key`]).
pub(crate) const OFFSET_MARK: &str = "\u{0}fence";
/// Marks the key holding a hold's description, on the hold's own lease.
pub(crate) const INFO_MARK: &str = "\u{0}info";

/// A MoltLock backend on etcd v3.
///
/// Each instance is one session: the holds it writes hang on its own leases
/// (one per distinct TTL, in whole seconds), kept alive by the manager's
/// renewal rounds through [`Backend::renew_many`]. Cheap to clone; clones
/// share the session. Give each [`LockManager`](moltlock_core::LockManager)
/// its own instance.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) session: Session,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) min_ttl: Duration,
    pub(crate) wakeups: Arc<AtomicU64>,
    /// The one watch stream every waiter of this backend shares.
    pub(crate) watches: Arc<WatchHub>,
    /// Owner-checked deletes asked for but not confirmed (failed, timed out
    /// or dropped mid-request). Their keys hang on this session's lease,
    /// which further use of the session keeps alive, so every acquisition
    /// and renewal round first retries them.
    /// The flag is set while a request for the delete is in flight.
    pub(crate) pending: std::sync::Mutex<HashMap<(LockKey, Token), bool>>,
    /// The token this session last wrote to each lock key, for keys whose
    /// last write by this session is known to have landed. A key still
    /// attached to the session's lease holds exactly that token (nobody else
    /// writes on our lease, and any other write detaches the key), so a
    /// renewal round checks its holds with one lease query instead of
    /// reading every key. An entry is dropped before each write of its key
    /// and restored only when etcd confirms the write.
    pub(crate) written: std::sync::Mutex<HashMap<Vec<u8>, Token>>,
}

/// The most unconfirmed deletes remembered; past it, holds live until the
/// session ends.
const MAX_PENDING: usize = 4096;

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects with `config` and checks that etcd answers (and, with auth,
    /// that the credentials work).
    ///
    /// # Errors
    /// [`Error::Config`] for bad TLS files or endpoints, [`Error::Auth`] for
    /// wrong credentials, [`Error::Unavailable`] when etcd does not answer.
    pub async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        config.validate()?;
        let opts = connect_options(&config)?;
        let dial = config.dial_timeout;
        let client = match tokio::time::timeout(
            dial,
            Client::connect(&config.endpoints, Some(opts)),
        )
        .await
        {
            Ok(r) => r.map_err(map)?,
            Err(_) => return Err(timed_out("connecting", dial)),
        };
        let mut probe = client.clone();
        let opts = GetOptions::new().with_count_only();
        call(
            "the first request",
            dial + config.request_timeout,
            probe.get(config.prefix.clone(), Some(opts)),
        )
        .await?;
        let session = Session::new(client.clone(), config.session_ttl, config.request_timeout);
        let watches = Arc::new(WatchHub::new(client.clone(), config.request_timeout));
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                session,
                prefix: config.prefix,
                timeout: config.request_timeout,
                min_ttl: config.session_ttl,
                wakeups: Arc::new(AtomicU64::new(0)),
                watches,
                pending: std::sync::Mutex::new(HashMap::new()),
                written: std::sync::Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Parses `url` (see [`EtcdConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// As [`EtcdConfig::from_url`] and [`connect`](Self::connect).
    pub async fn from_url(url: &str) -> Result<Self, Error> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// The etcd client, for administration beside the locks.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The key prefix of this backend's locks.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The ids of the session's live leases (one per TTL in use).
    pub fn lease_ids(&self) -> Vec<i64> {
        self.shared.session.ids()
    }

    /// How many times a waiter of this instance was woken by a watch event
    /// (release watches and fair-queue waits): a diagnostic that shows a
    /// release wakes one waiter, not a herd.
    pub fn watch_wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::Relaxed)
    }

    /// How many watch streams this backend has opened (one, unless a stream
    /// failed): every waiter shares one.
    pub fn watch_streams_opened(&self) -> u64 {
        self.shared.watches.streams_opened()
    }

    /// Ends the session: revokes its leases, so every hold it wrote vanishes
    /// at once (their guards report `lost()` at the next renewal).
    ///
    /// # Errors
    /// The failure of a revoke request.
    pub async fn close(&self) -> Result<(), Error> {
        self.shared.session.revoke_all().await
    }
}

fn connect_options(cfg: &EtcdConfig) -> Result<ConnectOptions, Error> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.dial_timeout)
        .with_keep_alive(Duration::from_secs(2), cfg.dial_timeout)
        .with_require_leader(true);
    if let Some((user, pass)) = &cfg.user {
        opts = opts.with_user(user.clone(), pass.clone());
    }
    if let Some(tls) = &cfg.tls {
        let mut t = etcd_client::TlsOptions::new();
        if let Some(ca) = &tls.ca {
            t = t.ca_certificate(etcd_client::Certificate::from_pem(ca.load()?));
        }
        if let Some((cert, key)) = &tls.client {
            t = t.identity(etcd_client::Identity::from_pem(cert.load()?, key.load()?));
        }
        if let Some(d) = &tls.domain {
            t = t.domain_name(d.clone());
        }
        opts = opts.with_tls(t);
    }
    Ok(opts)
}

impl Shared {
    pub(crate) fn full_key(&self, key: &LockKey) -> Vec<u8> {
        format!("{}{}", self.prefix, key.as_str()).into_bytes()
    }

    /// Where [`Backend::raise_fence`] keeps the key's fence offset (no
    /// lease: it outlives every hold). A lock key has no control characters,
    /// so no lock key can name it.
    pub(crate) fn offset_key(&self, key: &LockKey) -> Vec<u8> {
        format!("{}{}{OFFSET_MARK}", self.prefix, key.as_str()).into_bytes()
    }

    /// The key holding the description of `key`'s hold.
    pub(crate) fn info_key(&self, key: &LockKey) -> Vec<u8> {
        format!("{}{}{INFO_MARK}", self.prefix, key.as_str()).into_bytes()
    }

    pub(crate) fn queue_prefix(&self, key: &LockKey) -> Vec<u8> {
        format!("{}{}{QUEUE_MARK}", self.prefix, key.as_str()).into_bytes()
    }

    pub(crate) fn queue_entry(&self, key: &LockKey, token: &Token) -> Vec<u8> {
        format!(
            "{}{}{QUEUE_MARK}{}",
            self.prefix,
            key.as_str(),
            token.as_str()
        )
        .into_bytes()
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse, etcd_client::Error> {
        let mut kv = self.client.kv_client();
        match tokio::time::timeout(self.timeout, kv.txn(txn)).await {
            Ok(r) => r,
            Err(_) => Err(etcd_client::Error::GRpcStatus(
                tonic::Status::deadline_exceeded("txn did not answer within the request timeout"),
            )),
        }
    }

    /// `Txn(if create_revision(key) == 0 then put(key, token, lease) else get(key))`,
    /// with one more try on a fresh lease if the session's lease vanished.
    pub(crate) async fn create(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.flush_pending().await;
        let k = self.full_key(key);
        self.forget_write(&k);
        let mut retried = false;
        loop {
            let lease = self.session.lease_for(ttl).await?;
            let put = PutOptions::new().with_lease(lease.id);
            let txn = Txn::new()
                .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(k.clone(), token.as_str(), Some(put)),
                    TxnOp::get(self.offset_key(key), None),
                    TxnOp::delete(self.info_key(key), None),
                ])
                .or_else([TxnOp::get(k.clone(), None)]);
            match self.txn(txn).await {
                Err(e) if is_lease_not_found(&e) && !retried => {
                    self.session.forget(lease.id);
                    retried = true;
                }
                Err(e) => return Err(map(e)),
                Ok(resp) if resp.succeeded() => {
                    self.record_write(k, token);
                    // `earliest_expiry` reports the session's current lease;
                    // if the one this key went on was replaced meanwhile (a
                    // slow request), that bound is not the key's. Give the
                    // hold back and let the caller retry.
                    if self.session.current(ttl).map(|l| l.id) != Some(lease.id) {
                        self.release(key, token).await?;
                        return Err(Error::store(
                            NAME,
                            "the session lease was replaced while the key was being taken",
                            true,
                        ));
                    }
                    let offset = offset_in(&resp, 1);
                    return Ok(CasOutcome::Acquired {
                        fence: fence(header_revision(&resp)?.saturating_add(offset))?,
                    });
                }
                Ok(resp) => return Ok(CasOutcome::Held(held(&resp))),
            }
        }
    }

    /// Renewal of one hold: compare the value, then keep its lease alive.
    async fn renew_one(&self, key: &LockKey, token: &Token) -> Result<CasOutcome, Error> {
        let k = self.full_key(key);
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, token.as_str())])
            .and_then([TxnOp::get(k.clone(), None)])
            .or_else([TxnOp::get(k, None)]);
        let resp = self.txn(txn).await.map_err(map)?;
        if !resp.succeeded() {
            return Ok(CasOutcome::Held(held(&resp)));
        }
        let Some(kv) = first_kv(&resp) else {
            return Ok(CasOutcome::Held(held(&resp)));
        };
        if kv.lease() != 0 && self.session.keep_alive(kv.lease()).await?.is_none() {
            return Ok(CasOutcome::Held(Held::default()));
        }
        Ok(CasOutcome::Acquired {
            fence: fence(kv.mod_revision())?,
        })
    }

    /// Hands a hold from `old` to `new`: compare value == old, then put new.
    /// The new holder's fence is the revision of that put (the key's mod
    /// revision), above the old holder's: the key's create revision stays
    /// the old holder's, so it cannot be the fence of a hand-over.
    async fn replace(
        &self,
        key: &LockKey,
        old: &Token,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let k = self.full_key(key);
        self.forget_write(&k);
        let lease = self.session.lease_for(ttl).await?;
        let put = PutOptions::new().with_lease(lease.id);
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, old.as_str())])
            .and_then([
                TxnOp::put(k.clone(), new.as_str(), Some(put)),
                TxnOp::get(k.clone(), None),
                TxnOp::get(self.offset_key(key), None),
                TxnOp::delete(self.info_key(key), None),
            ])
            .or_else([TxnOp::get(k.clone(), None)]);
        let resp = self.txn(txn).await.map_err(map)?;
        match first_kv(&resp) {
            Some(kv) if resp.succeeded() => {
                self.record_write(k, new);
                Ok(CasOutcome::Acquired {
                    fence: fence(kv.mod_revision().saturating_add(offset_in(&resp, 2)))?,
                })
            }
            _ => Ok(CasOutcome::Held(held(&resp))),
        }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Token>> {
        match self.written.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The key is about to be written (or deleted): its outcome is unknown
    /// until etcd answers.
    fn forget_write(&self, full_key: &[u8]) {
        self.written().remove(full_key);
    }

    fn record_write(&self, full_key: Vec<u8>, token: &Token) {
        self.written().insert(full_key, token.clone());
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<(LockKey, Token), bool>> {
        match self.pending.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Owner-checked release: the key goes only if `owner` holds it; the
    /// owner's fair-queue entry (if any) goes either way. A release that
    /// fails, or whose future is dropped before etcd answers, stays on the
    /// pending list and is retried by the session's next use.
    pub(crate) async fn release(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let item = (key.clone(), owner.clone());
        {
            let mut pending = self.pending();
            if pending.len() < MAX_PENDING {
                pending.insert(item.clone(), true);
            }
        }
        let mut claim = Claim {
            shared: self,
            item: Some(item),
        };
        let deleted = self.release_once(key, owner).await?;
        claim.done();
        Ok(deleted)
    }

    async fn release_once(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let k = self.full_key(key);
        self.forget_write(&k);
        let entry = self.queue_entry(key, owner);
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, owner.as_str())])
            .and_then([
                TxnOp::delete(k, None),
                TxnOp::delete(entry.clone(), None),
                TxnOp::delete(self.info_key(key), None),
            ])
            .or_else([TxnOp::delete(entry, None)]);
        Ok(self.txn(txn).await.map_err(map)?.succeeded())
    }

    /// Retries the unconfirmed deletes that nobody is sending now; stops at
    /// the first failure (the store is likely unreachable, and the caller's
    /// own request will say so).
    pub(crate) async fn flush_pending(&self) {
        let items: Vec<(LockKey, Token)> = {
            let mut pending = self.pending();
            let idle: Vec<_> = pending
                .iter()
                .filter(|(_, busy)| !**busy)
                .map(|(k, _)| k.clone())
                .collect();
            for item in &idle {
                pending.insert(item.clone(), true);
            }
            idle
        };
        let mut items = items.into_iter();
        for (key, token) in items.by_ref() {
            let mut claim = Claim {
                shared: self,
                item: Some((key.clone(), token.clone())),
            };
            match self.release_once(&key, &token).await {
                Ok(_) => claim.done(),
                Err(e) => {
                    tracing::debug!(%key, error = %e, "a pending release failed again");
                    break;
                }
            }
        }
        let mut pending = self.pending();
        for item in items {
            pending.insert(item, false);
        }
    }

    /// Which of `items` (all on lease `lease`) still hold their keys: one
    /// lease query for the keys whose last write by this session is known,
    /// a read for the rest (and for all, should the query fail).
    pub(crate) async fn still_held_on(
        &self,
        lease: i64,
        items: &[&RenewItem],
    ) -> Result<Vec<bool>, Error> {
        let attached = self.attached_keys(lease).await;
        let mut out = vec![false; items.len()];
        let mut unknown = Vec::new();
        {
            let written = self.written();
            for (i, item) in items.iter().enumerate() {
                let k = self.full_key(&item.key);
                match &attached {
                    Some(keys) if written.get(&k) == Some(&item.token) => {
                        out[i] = keys.contains(&k);
                    }
                    _ => unknown.push(i),
                }
            }
        }
        if !unknown.is_empty() {
            let rest: Vec<&RenewItem> = unknown.iter().map(|i| items[*i]).collect();
            for (i, h) in unknown.iter().zip(self.still_held(&rest).await?) {
                out[*i] = h;
            }
        }
        Ok(out)
    }

    /// The keys attached to `lease`, or `None` when etcd would not say.
    async fn attached_keys(&self, lease: i64) -> Option<HashSet<Vec<u8>>> {
        let mut client = self.client.clone();
        let opts = LeaseTimeToLiveOptions::new().with_keys();
        let query = client.lease_time_to_live(lease, Some(opts));
        match call("lease time-to-live", self.timeout, query).await {
            Ok(r) if r.ttl() > 0 => Some(r.keys().iter().cloned().collect()),
            Ok(_) => Some(HashSet::new()),
            Err(e) => {
                tracing::debug!(error = %e, "lease query failed; reading keys instead");
                None
            }
        }
    }

    /// Whether each `(key, token)` still holds, in Txns of at most
    /// [`TXN_CHUNK`] reads.
    async fn still_held(&self, items: &[&RenewItem]) -> Result<Vec<bool>, Error> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(TXN_CHUNK) {
            let gets: Vec<TxnOp> = chunk
                .iter()
                .map(|i| TxnOp::get(self.full_key(&i.key), None))
                .collect();
            let resp = self.txn(Txn::new().and_then(gets)).await.map_err(map)?;
            let answers = resp.op_responses();
            if answers.len() != chunk.len() {
                return Err(Error::store(NAME, "a renewal read answered short", true));
            }
            for (item, answer) in chunk.iter().zip(answers) {
                out.push(matches!(&answer, TxnOpResponse::Get(g)
                    if g.kvs().first().is_some_and(|kv| kv.value() == item.token.as_str().as_bytes())));
            }
        }
        Ok(out)
    }

    /// The current revision and the key's fence offset.
    pub(crate) async fn read_offset(&self, key: &LockKey) -> Result<(i64, i64), Error> {
        let mut client = self.client.clone();
        let resp = call("get", self.timeout, client.get(self.offset_key(key), None)).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let offset = resp.kvs().first().map_or(0, |kv| parse_offset(kv.value()));
        Ok((revision, offset))
    }

    async fn lease_left(&self, lease: i64) -> Result<Option<Duration>, Error> {
        if lease == 0 {
            return Ok(None);
        }
        let mut client = self.client.clone();
        let resp = call(
            "lease time-to-live",
            self.timeout,
            client.lease_time_to_live(lease, None),
        )
        .await;
        match resp {
            Ok(r) => Ok(u64::try_from(r.ttl()).ok().map(Duration::from_secs)),
            Err(e) if e.is_retryable() => Err(e),
            Err(_) => Ok(None),
        }
    }

    async fn holder_info(
        &self,
        key: String,
        kv: &KeyValue,
        ttls: &mut HashMap<i64, Option<Duration>>,
    ) -> Result<HolderInfo, Error> {
        let expires_in = match ttls.get(&kv.lease()) {
            Some(t) => *t,
            None => {
                let t = self.lease_left(kv.lease()).await?;
                ttls.insert(kv.lease(), t);
                t
            }
        };
        Ok(HolderInfo {
            key,
            holder: Token::from_stored(String::from_utf8_lossy(kv.value())),
            // Only an acquisition or a hand-over writes the key, so its mod
            // revision is the revision that gave it to its holder.
            fence: u64::try_from(kv.mod_revision()).ok().map(Fence),
            expires_in,
            description: None,
        })
    }

    /// The description stored with `key`'s hold, if any.
    pub(crate) async fn description(&self, key: &LockKey) -> Result<Option<String>, Error> {
        let mut client = self.client.clone();
        let resp = call("get", self.timeout, client.get(self.info_key(key), None)).await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }
}

/// Marks a pending delete as in flight; when dropped before
/// [`done`](Claim::done) (an error, or a dropped future) the delete goes
/// back to the pending list for the next flush.
struct Claim<'a> {
    shared: &'a Shared,
    item: Option<(LockKey, Token)>,
}

impl Claim<'_> {
    fn done(&mut self) {
        if let Some(item) = self.item.take() {
            self.shared.pending().remove(&item);
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            if let Some(busy) = self.shared.pending().get_mut(&item) {
                *busy = false;
            }
        }
    }
}

fn header_revision(resp: &TxnResponse) -> Result<i64, Error> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| Error::store(NAME, "a Txn answer had no header", true))
}

fn fence(revision: i64) -> Result<Fence, Error> {
    u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .map(Fence)
        .ok_or_else(|| Error::store(NAME, format!("etcd reported revision {revision}"), true))
}

/// The fence offset read by the Txn's `index`-th operation (0 if none).
fn offset_in(resp: &TxnResponse, index: usize) -> i64 {
    match resp.op_responses().get(index) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map_or(0, |kv| parse_offset(kv.value())),
        _ => 0,
    }
}

fn parse_offset(value: &[u8]) -> i64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The first key-value of the first Get answer of a Txn.
fn first_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    })
}

/// What a failed Txn saw: the holder (from its Get) and the header revision.
fn held(resp: &TxnResponse) -> Held {
    Held {
        holder: first_kv(resp).map(|kv| Token::from_stored(String::from_utf8_lossy(kv.value()))),
        expires_in: None,
        revision: resp.header().and_then(|h| u64::try_from(h.revision()).ok()),
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    /// One Txn. `expected == None`: create the key on the session lease
    /// (fence = its create revision). `Some(t)` with `new == t`: renewal
    /// (compare value, keep the lease alive). `Some(a)`, `new == b`: compare
    /// value == a, then put b (fence = that put's revision). Cancel safe in the core's sense: a dropped
    /// call may still land; the manager's owner-checked delete removes it.
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        match expected {
            None => self.shared.create(key, new, ttl).await,
            Some(t) if t == new => self.shared.renew_one(key, t).await,
            Some(old) => self.shared.replace(key, old, new, ttl).await,
        }
    }

    /// `Txn(if value(key) == owner then delete(key))`; also removes the
    /// owner's fair-queue entry.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.shared.release(key, owner).await
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn limits(&self) -> Limits {
        Limits::new()
            .with_min_ttl(self.shared.min_ttl)
            // A request the client gave up on may still be applied: a lock
            // key, or a fair-queue entry, that lands after the first
            // cleanup delete is removed by a later one (a release deletes
            // the caller's queue entry too).
            .with_late_write(self.shared.timeout + Duration::from_secs(1))
    }

    /// The lease's own bound: the instant before its last confirmed grant or
    /// keep-alive, plus its TTL.
    fn earliest_expiry(&self, ttl: Duration, sent_at: Instant) -> Instant {
        self.shared.session.bound(ttl, sent_at)
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Some(self)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        Some(self)
    }

    fn describer(&self) -> Option<&dyn Describe> {
        Some(self)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        Some(self)
    }

    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        Some(self)
    }
}

#[async_trait]
impl Watch for EtcdBackend {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        Ok(Box::new(KeyWatch {
            hub: self.shared.watches.clone(),
            key: self.shared.full_key(key),
            wakeups: self.shared.wakeups.clone(),
        }))
    }
}

#[async_trait]
impl Inspect for EtcdBackend {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let mut client = self.shared.client.clone();
        let resp = call(
            "get",
            self.shared.timeout,
            client.get(self.shared.full_key(key), None),
        )
        .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let mut info = self
            .shared
            .holder_info(key.as_str().to_owned(), kv, &mut HashMap::new())
            .await?;
        let (_, offset) = self.shared.read_offset(key).await?;
        info.fence = info
            .fence
            .map(|f| Fence(f.get().saturating_add(offset.unsigned_abs())));
        info.description = self.shared.description(key).await?;
        Ok(Some(info))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let mut client = self.shared.client.clone();
        let full = format!("{}{prefix}", self.shared.prefix);
        let opts = GetOptions::new().with_prefix();
        let resp = call("get", self.shared.timeout, client.get(full, Some(opts))).await?;
        // A key's fence offset (`<key>\0fence`) sorts right after the key
        // and is in the same range: fences reported include it, as
        // `inspect`'s do.
        let offsets: HashMap<String, i64> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = String::from_utf8_lossy(kv.key());
                let key = name.strip_prefix(&self.shared.prefix)?;
                let key = key.strip_suffix(OFFSET_MARK)?;
                Some((key.to_owned(), parse_offset(kv.value())))
            })
            .collect();
        let mut ttls = HashMap::new();
        let mut descriptions = HashMap::new();
        let mut out = Vec::new();
        for kv in resp.kvs() {
            let name = String::from_utf8_lossy(kv.key());
            let Some(key) = name.strip_prefix(&self.shared.prefix) else {
                continue;
            };
            if let Some(held) = key.strip_suffix(INFO_MARK) {
                let text = String::from_utf8_lossy(kv.value()).into_owned();
                descriptions.insert(held.to_owned(), text);
                continue;
            }
            if key.contains(QUEUE_MARK) || key.contains(OFFSET_MARK) {
                continue;
            }
            let mut info = self
                .shared
                .holder_info(key.to_owned(), kv, &mut ttls)
                .await?;
            if let Some(offset) = offsets.get(key) {
                info.fence = info
                    .fence
                    .map(|f| Fence(f.get().saturating_add(offset.unsigned_abs())));
            }
            out.push(info);
        }
        for info in &mut out {
            info.description = descriptions.remove(&info.key);
        }
        Ok(out)
    }
}

#[async_trait]
impl RenewMany for EtcdBackend {
    /// One keep-alive per lease in use, then one lease query per lease (and
    /// reads only for keys whose last write is uncertain) to check each hold
    /// still has its token. A lease that is gone makes every hold on it
    /// report not held.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        // Deletes left over from an outage (up to 4,096, one request each)
        // must not hold up the keep-alive: they run beside it.
        let shared = self.shared.clone();
        tokio::spawn(async move { shared.flush_pending().await });
        let session = &self.shared.session;
        let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            groups
                .entry(session.secs_for(item.ttl))
                .or_default()
                .push(i);
        }
        let mut out = vec![false; items.len()];
        for idx in groups.values() {
            let Some(first) = idx.first() else { continue };
            let Some(lease) = session.renew(items[*first].ttl).await? else {
                continue;
            };
            let group: Vec<&RenewItem> = idx.iter().map(|i| &items[*i]).collect();
            let held = self.shared.still_held_on(lease.id, &group).await?;
            for (i, h) in idx.iter().zip(held) {
                out[*i] = h;
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Describe for EtcdBackend {
    /// Puts the description on the hold's own lease, in a Txn that checks
    /// the token and the lease, so it ends with the hold.
    async fn describe(
        &self,
        key: &LockKey,
        owner: &Token,
        description: &str,
    ) -> Result<bool, Error> {
        let k = self.shared.full_key(key);
        let mut client = self.shared.client.clone();
        let resp = call("get", self.shared.timeout, client.get(k.clone(), None)).await?;
        let Some(kv) = resp
            .kvs()
            .first()
            .filter(|kv| kv.value() == owner.as_str().as_bytes())
        else {
            return Ok(false);
        };
        let lease = kv.lease();
        let put = PutOptions::new().with_lease(lease);
        let txn = Txn::new()
            .when([
                Compare::value(k.clone(), CompareOp::Equal, owner.as_str()),
                Compare::lease(k, CompareOp::Equal, lease),
            ])
            .and_then([TxnOp::put(
                self.shared.info_key(key),
                description,
                Some(put),
            )]);
        Ok(self.shared.txn(txn).await.map_err(map)?.succeeded())
    }
}

#[async_trait]
impl RaiseFence for EtcdBackend {
    /// Lifts the key's fence offset so that `create revision + offset`
    /// exceeds `floor` for every later hold: revisions only grow and the
    /// offset never shrinks.
    async fn raise_fence(&self, key: &LockKey, floor: Fence) -> Result<(), Error> {
        let (revision, offset) = self.shared.read_offset(key).await?;
        let floor = i64::try_from(floor.get())
            .map_err(|_| Error::Config(format!("fence floor {floor} exceeds etcd's revisions")))?;
        let needed = floor.saturating_sub(revision);
        if needed <= offset {
            return Ok(());
        }
        let mut client = self.shared.client.clone();
        let put = client.put(self.shared.offset_key(key), needed.to_string(), None);
        call("put", self.shared.timeout, put).await?;
        Ok(())
    }
}

#[async_trait]
impl FairQueue for EtcdBackend {
    async fn fair_acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<Fence, Error> {
        crate::fair::acquire(&self.shared, key, token, ttl).await
    }
}
