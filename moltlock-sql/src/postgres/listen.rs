//! Wake-ups by `LISTEN/NOTIFY`: one listening connection per backend,
//! opened by the first waiter, that reconnects by itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use moltlock_core::{Error, Held, KeyEvents, ReleaseWatch};
use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

/// The waiters of one backend and the task that wakes them.
pub(super) struct Listener {
    channel: String,
    events: Arc<KeyEvents>,
    /// The fair waiters' subscriptions to the releases that name them,
    /// fired only by such a release (never by a reconnection), so a wake
    /// from here means the release's own read found that waiter at the
    /// head.
    heads: Arc<KeyEvents>,
    task: OnceCell<JoinHandle<()>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

impl Listener {
    /// Waiters on `channel`; nothing listens until the first one.
    pub(super) fn new(channel: String) -> Self {
        Self {
            channel,
            events: Arc::new(KeyEvents::new()),
            heads: Arc::new(KeyEvents::new()),
            task: OnceCell::new(),
        }
    }

    /// The channel releases notify.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// A watch for the release of `key`, and with `named` one for the
    /// releases that name that fair waiter (see [`dispatch`]), listening
    /// first if nobody does yet.
    pub(super) async fn watch(
        &self,
        pool: &PgPool,
        key: &str,
        named: Option<&str>,
    ) -> Result<(Box<dyn ReleaseWatch>, Option<Box<dyn ReleaseWatch>>), sqlx::Error> {
        self.task
            .get_or_try_init(|| async {
                let listener = subscribe(pool, &self.channel).await?;
                let task = listen(
                    listener,
                    pool.clone(),
                    self.channel.clone(),
                    (self.events.clone(), self.heads.clone()),
                );
                Ok::<_, sqlx::Error>(tokio::spawn(task))
            })
            .await?;
        let named = named.map(|token| self.heads.subscribe(&format!("{key}{HEAD_MARK}{token}")));
        Ok((self.events.subscribe(key), named))
    }
}

/// What separates a release's key from the fair queue head it names.
pub(super) const HEAD_MARK: char = '\u{1}';
/// How long after a release that names a fair queue's head the key's other
/// waiters are woken: long enough for the head to take the key first.
const TURN: Duration = Duration::from_millis(20);

/// Wakes the waiters a release's `payload` concerns: those of its key, or,
/// when it names the key's fair queue head, that waiter at once and the
/// key's others a [`TURN`] later (at most once per turn). A release then
/// sets one fair waiter going, not the whole queue; the rest look again
/// after the head had its turn, which also covers a named head that has
/// just given up.
fn dispatch((events, heads): &(Arc<KeyEvents>, Arc<KeyEvents>), payload: &str) {
    match payload.split_once(HEAD_MARK) {
        Some((key, _)) => {
            heads.fire(payload);
            events.fire_later(key, TURN);
        }
        None => events.fire(payload),
    }
}

/// The release of `$1` by `$2` from table `t` (a hold is `live`),
/// notifying channel `$3` when a waiter marked the row (`CASE` decides whether `pg_notify` runs; `AND`
/// would not). The payload is the key, and when the key's fair queue
/// (table `places`) has a live place, a `\x01` and the head's token: that
/// waiter is woken at once, the key's other waiters a turn later (see
/// [`dispatch`]), so a release sets one fair waiter going, not all.
pub(super) fn release(t: &str, places: &str, live: &str) -> String {
    format!(
        "UPDATE {t} SET owner = '', expires_at = 'epoch', acquired_at = now(), \
         version = version + 1 \
         WHERE key = $1 AND owner = $2 AND owner <> '' AND {live} \
         RETURNING (CASE WHEN wait_until > now() THEN pg_notify($3, key || COALESCE(chr(1) || \
         (SELECT p.owner FROM {places} p WHERE p.key = $1 AND p.alive_until > now() \
         ORDER BY p.seq LIMIT 1), '')) END) IS NULL"
    )
}

/// The mark of a waiter whose attempt on `$1` saw holder `$2` (`NULL`: it
/// saw none): the row is marked while that hold lasts, replying the mark's
/// ms left; no row when the hold has ended. A mark with at least
/// [`MARK_KEEP_SECS`] left is kept as it is, so most marks are reads, with
/// no commit to flush: the waiters of a busy key mark once per few seconds
/// between them, not once per wait. Marks only ever move later, so a mark
/// the statement's snapshot shows fresh is fresh. One it shows stale that
/// the update then misses (the row changed under it: another waiter
/// marked it, or the hold ended) replies `NULL`: the mark is asked again,
/// with a snapshot that shows which.
pub(super) fn mark(t: &str, live: &str) -> String {
    let seen = format!("key = $1 AND ($2::text IS NULL OR owner = $2) AND owner <> '' AND {live}");
    let keep = format!("now() + interval '{MARK_KEEP_SECS} seconds'");
    format!(
        "WITH cur AS (SELECT wait_until FROM {t} WHERE {seen}), \
         up AS (UPDATE {t} SET wait_until = now() + interval '{MARK_SECS} seconds' \
         WHERE {seen} AND wait_until < {keep} RETURNING wait_until) \
         SELECT (extract(epoch FROM COALESCE((SELECT wait_until FROM up), \
         CASE WHEN cur.wait_until >= {keep} THEN cur.wait_until END) - now()) * 1000)::bigint \
         FROM cur"
    )
}

/// How often a mark is asked again when the row changed under it.
const MARK_TRIES: usize = 3;

/// How long a waiter's mark lasts, by the database clock.
const MARK_SECS: u64 = 10;
/// A mark with this long left is not written again.
const MARK_KEEP_SECS: u64 = 5;

/// How long before its mark ends a waiter marks again.
const MARK_MARGIN: Duration = Duration::from_secs(1);
/// The shortest wait between marks, whatever a mark replied.
const MIN_MARK_WAIT: Duration = Duration::from_millis(100);

/// A waiter's watch: it keeps the key's row marked while it waits, so the
/// release notifies (see the `postgres` module docs).
pub(super) struct Marking {
    /// The subscription, made before the attempt.
    pub(super) events: Box<dyn ReleaseWatch>,
    /// A fair waiter's subscription to the releases that name it.
    pub(super) named: Option<Box<dyn ReleaseWatch>>,
    /// Set when a wait ended by a release that named this fair waiter.
    pub(super) woke_named: Arc<AtomicBool>,
    pub(super) pool: PgPool,
    /// The marking statement.
    pub(super) mark: Arc<str>,
    pub(super) key: String,
    /// Until when (by this clock, from the mark's send) the last mark lasts.
    pub(super) marked_until: Option<Instant>,
}

impl Marking {
    /// The next release of the key, or one that names this waiter (which
    /// sets [`woke_named`](Self::woke_named)).
    async fn next_release(&mut self, held: &Held) -> Result<(), Error> {
        match self.named.as_mut() {
            Some(named) => tokio::select! {
                told = self.events.released(held) => told,
                told = named.released(held) => {
                    self.woke_named.store(told.is_ok(), Ordering::Relaxed);
                    told
                }
            },
            None => self.events.released(held).await,
        }
    }

    /// Marks the row while the hold `held` names lasts; `false` when it has
    /// ended.
    /// (After [`MARK_TRIES`] rows changed under it, `false`: the waiter
    /// looks again.)
    async fn mark(&mut self, held: &Held) -> Result<bool, Error> {
        for _ in 0..MARK_TRIES {
            let sent = Instant::now();
            let left: Option<Option<i64>> = sqlx::query_scalar(&self.mark)
                .bind(&self.key)
                .bind(held.holder.as_ref().map(|t| t.as_str()))
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| crate::error::map(<super::Pg as crate::dialect::Ops>::NAME, e))?;
            match left {
                None => return Ok(false),
                Some(None) => continue,
                Some(Some(left)) => {
                    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
                    self.marked_until = Some(sent + left);
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

/// # Cancel safety
/// A mark dropped in flight may land or not: an unneeded mark costs a
/// notification, and the next wait marks again unless it knows its mark.
#[async_trait]
impl ReleaseWatch for Marking {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        loop {
            let now = Instant::now();
            let fresh = self.marked_until.is_some_and(|u| u > now + MARK_MARGIN);
            if !fresh && !self.mark(held).await? {
                return Ok(()); // the hold the attempt saw has ended: look again
            }
            let until = self.marked_until.unwrap_or(now);
            let wait = until
                .saturating_duration_since(Instant::now() + MARK_MARGIN)
                .max(MIN_MARK_WAIT);
            if let Ok(told) = tokio::time::timeout(wait, self.next_release(held)).await {
                return told;
            }
            self.marked_until = None; // about to end: mark again
        }
    }
}

/// A connection that listens on `channel`.
async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Dispatches notifications to waiters. When the connection drops, it opens
/// a new one itself and wakes every waiter twice: at once, and again once
/// the new connection listens — a release sent while nobody listened was
/// missed, and the woken waiters look for themselves.
async fn listen(
    mut listener: PgListener,
    pool: PgPool,
    channel: String,
    subscribers: (Arc<KeyEvents>, Arc<KeyEvents>),
) {
    let events = &subscribers.0;
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => dispatch(&subscribers, n.payload()),
            Ok(None) | Err(_) => {
                tracing::debug!("listen connection lost; reconnecting");
                events.fire_all();
                listener = loop {
                    match subscribe(&pool, &channel).await {
                        Ok(l) => break l,
                        Err(e) => {
                            tracing::debug!(error = %e, "listen connection failed; retrying");
                            events.fire_all();
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                };
                events.fire_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use moltlock_core::{LockManager, Token};

    use crate::{PostgresBackend, SqlConfig};

    /// The mark statement of table `t`: `Some(None)` when the row changed
    /// under it, `Some(Some(ms left))` when marked, `None` when not held.
    async fn run_mark(pool: &sqlx::PgPool, t: &str) -> Option<Option<i64>> {
        let sql = super::mark(&format!("\"{t}\""), "expires_at > now()");
        let asked = sqlx::query_scalar(&sql)
            .bind("k")
            .bind(None::<&str>)
            .fetch_optional(pool);
        asked.await.unwrap_or_else(|e| panic!("the mark: {e}"))
    }

    /// A stale mark that another waiter's mark renews while this one waits
    /// for the row replies `NULL` (asked again), not "the hold ended"; asked
    /// again, it reads the fresh mark.
    #[tokio::test]
    async fn a_mark_raced_by_another_is_asked_again() {
        let url = moltlock_fixtures::postgres::shared_url().unwrap_or_else(|e| panic!("{e}"));
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let t = format!("mark_race_{}", &Token::random().as_str()[..8]);
        let backend = PostgresBackend::from_client(pool.clone(), SqlConfig::default().table(&t));
        let held = LockManager::new(backend.await.unwrap())
            .lock("k")
            .await
            .unwrap();
        let stale = format!("UPDATE \"{t}\" SET wait_until = now() + interval '1 second'");
        sqlx::query(&stale).execute(&pool).await.unwrap();
        let mut other = pool.begin().await.unwrap();
        let fresh = format!("UPDATE \"{t}\" SET wait_until = now() + interval '10 seconds'");
        sqlx::query(&fresh).execute(&mut *other).await.unwrap();
        let raced = tokio::spawn({
            let (pool, t) = (pool.clone(), t.clone());
            async move { run_mark(&pool, &t).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        other.commit().await.unwrap();
        assert_eq!(
            raced.await.unwrap(),
            Some(None),
            "a raced mark looked ended"
        );
        let again = run_mark(&pool, &t).await;
        assert!(
            matches!(again, Some(Some(ms)) if ms > 8_000),
            "asked again: {again:?}"
        );
        held.release().await.unwrap();
        let drop = format!("DROP TABLE \"{t}\", \"{t}_queue\"; DROP SEQUENCE \"{t}_fence\"");
        sqlx::raw_sql(&drop).execute(&pool).await.unwrap();
    }
}
