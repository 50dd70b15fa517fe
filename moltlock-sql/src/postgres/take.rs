//! Taking free keys: the single acquisition and the batch (`CasMulti`),
//! one statement each, sharing the upsert that writes a hold and the
//! reading of what a refused attempt saw.
//!
//! The batch statement judges each key by the statement's `now()` (or the
//! observed expiry) as the single acquisition does, and writes every key
//! through the same upsert, so each fence is `max(the key's last fence + 1,
//! nextval)`: above every earlier fence of the key and any raised minimum.
//!
//! `All` locks the rows of its keys first (`FOR UPDATE`, in key order, so
//! two batches cannot deadlock on them) and writes, in key order, only when
//! no key is busy. A key with no row has nothing to lock: should another
//! session insert it between the statement's snapshot and its write, the
//! upsert skips it, and the statement then fails on purpose (so nothing it
//! wrote stays) and runs again, seeing the new hold.
//!
//! `Any` locks nothing beforehand: it writes the first key its snapshot
//! shows free, and the upsert's own test on the row's latest version
//! refuses it if another session took it meanwhile; it then runs again
//! (so contenders for a semaphore's slots spread over the free ones
//! instead of waiting on each other's row locks).

use moltlock_core::{CasOutcome, Error, Held, MultiMode, MultiOutcome, Token};
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};
use tokio::time::Instant;

use super::{saw_clock, Pg, NOW_US};
use crate::convert::{fence, left_ms, millis};
use crate::dialect::{DbResult, Multi, Ops, Shared, Write};
use crate::multi::Tally;

/// How often a batch runs again when keys it found free were taken under
/// it.
const ATTEMPTS: usize = 5;
/// What an `All` statement fails with when it could not write every key.
const RACED: &str = "moltlock: a key of the batch was taken meanwhile: ";

/// The upsert of a hold: `source` yields rows of `(key, owner, fence,
/// expires_at, acquired_at, version, ttl_ms)`; an existing row is taken
/// over only `WHERE take_if`. A statement that waited on a row lock may
/// carry an older `nextval` draw than the hold it replaces: `GREATEST`
/// with the row's own last fence keeps fences of the key rising.
pub(super) fn upsert(t: &str, source: &str, take_if: &str) -> String {
    format!(
        "INSERT INTO {t} AS l (key, owner, fence, expires_at, acquired_at, version, ttl_ms) \
         {source} ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
         fence = GREATEST(l.fence + 1, EXCLUDED.fence), info = NULL, \
         expires_at = EXCLUDED.expires_at, acquired_at = EXCLUDED.acquired_at, \
         version = l.version + 1, ttl_ms = EXCLUDED.ttl_ms WHERE {take_if}"
    )
}

/// The ms a hold has left, by the database clock.
pub(super) const LEFT: &str = "(extract(epoch FROM expires_at - now()) * 1000)::bigint";

/// The single acquisition of `$1` for `$2` for `$3` ms, the hold written
/// from the row `source` yields (none: no write). Replies the fence taken,
/// or the holder seen (see `Statements::build`); no row when it wrote
/// nothing and saw no holder. `also` adds common table expressions after
/// the write `ins` (each starting with a comma), which may read it.
pub(super) fn single(t: &str, source: &str, observed: bool, also: &str) -> String {
    let (take_if, held, granted_clock) = terms(observed);
    format!(
        "WITH ins AS ({} RETURNING fence){also} \
         SELECT fence, NULL::text AS owner, NULL::bigint AS a, {granted_clock} AS b FROM ins \
         UNION ALL SELECT NULL, owner, {held} FROM {t} \
         WHERE key = $1 AND owner <> '' AND NOT EXISTS (SELECT 1 FROM ins)",
        upsert(t, source, take_if)
    )
}

/// When a held row may be taken over, what a refused attempt reports of
/// its holder (two figures, see [`Found`]) and the clock a grant reports.
fn terms(observed: bool) -> (&'static str, String, &'static str) {
    match observed {
        false => (
            "l.expires_at <= now()",
            format!("GREATEST({LEFT}, 0), {NOW_US}"),
            NOW_US,
        ),
        true => (
            "l.owner = '' OR (l.owner = $4 AND l.version = $5)",
            "version, ttl_ms".to_owned(),
            "NULL::bigint",
        ),
    }
}

/// The single acquisition of the default mode, in two statements: the
/// upsert alone (as [`single`]'s, without the read of the holder, whose
/// branch costs the database about a tenth of a lock + release's work
/// even when it is skipped), and the read of who holds the key, sent on
/// the same connection only when the upsert was refused. A free key costs
/// one round trip; a refused attempt two.
pub(super) struct Single {
    /// Replies `(fence, the server clock)`; no row when refused.
    take: String,
    /// Replies `(owner, a, b)` as [`single`] does; no row when the key
    /// has no holder.
    holder: String,
}

impl Single {
    /// The statements on table `t`, the hold written from `source`.
    pub(super) fn new(t: &str, source: &str, observed: bool) -> Self {
        let (take_if, held, granted_clock) = terms(observed);
        Self {
            take: format!(
                "{} RETURNING fence, {granted_clock}",
                upsert(t, source, take_if)
            ),
            holder: format!("SELECT owner, {held} FROM {t} WHERE key = $1 AND owner <> ''"),
        }
    }
}

/// The batch statements `(all, any)` on table `t` with fence sequence
/// `seq`. Parameters: keys `$1`, owner `$2`, TTL in ms `$3`, and in the
/// observed-expiry mode the `(holder, version)` pairs a takeover may name,
/// per key, `$4` and `$5`. Rows: `(index from 1, fence, owner, a, b)`, as
/// the single acquisition's (see `Statements::build`).
pub(super) fn batch(t: &str, seq: &str, observed: bool) -> (String, String) {
    let ms = "$3::bigint * interval '1 millisecond'";
    let k = match observed {
        false => "SELECT key, i FROM unnest($1::text[]) WITH ORDINALITY AS u(key, i)",
        true => "SELECT key, holder, version, i \
                 FROM unnest($1::text[], $4::text[], $5::bigint[]) WITH ORDINALITY AS u(key, holder, version, i)",
    };
    let busy = match observed {
        false => format!(
            "SELECT c.key, c.owner, \
             GREATEST((extract(epoch FROM c.expires_at - now()) * 1000)::bigint, 0) AS a, \
             {NOW_US} AS b FROM cur c WHERE c.expires_at > now()"
        ),
        true => "SELECT c.key, c.owner, c.version AS a, c.ttl_ms AS b FROM cur c JOIN k USING (key) \
                 WHERE NOT COALESCE(c.owner = '' OR (c.owner = k.holder AND c.version = k.version), false)"
            .to_owned(),
    };
    // Store clock: the row's latest version must have expired, as for the
    // single acquisition. Observed expiry: the row must be the version the
    // statement judged free (an `All` locked it; an `Any` refuses a row
    // changed since its snapshot).
    let (take_if, granted_clock) = match observed {
        false => ("l.expires_at <= now()", NOW_US),
        true => (
            "EXISTS (SELECT 1 FROM cur c WHERE c.key = l.key AND c.version = l.version)",
            "NULL::bigint",
        ),
    };
    let head = |lock: &str| {
        format!(
            "WITH k AS ({k}), \
             cur AS (SELECT l.key, l.owner, l.expires_at, l.version, l.ttl_ms FROM {t} l \
             WHERE l.key = ANY($1::text[]) {lock}), \
             busy AS ({busy})"
        )
    };
    let row = |from: &str| {
        format!("SELECT {from}, $2::text, nextval('{seq}'), now() + {ms}, now(), 1, $3::bigint")
    };
    let returning = "RETURNING l.key, l.fence";
    let busy_rows = "SELECT k.i, NULL, busy.owner, busy.a, busy.b FROM busy JOIN k USING (key)";
    let all_source = format!(
        "{} FROM k WHERE NOT EXISTS (SELECT 1 FROM busy) ORDER BY k.key",
        row("k.key")
    );
    let all = format!(
        "{}, ins AS ({} {returning}) \
         SELECT k.i, CASE WHEN (SELECT count(*) FROM ins) = (SELECT count(*) FROM k) \
         THEN ins.fence ELSE ('{RACED}' || ins.key)::bigint END, \
         NULL::text, NULL::bigint, {granted_clock} FROM ins JOIN k USING (key) \
         UNION ALL {busy_rows}",
        head("ORDER BY l.key FOR UPDATE"),
        upsert(t, &all_source, take_if)
    );
    let any = format!(
        "{}, pick AS (SELECT k.key FROM k \
         WHERE NOT EXISTS (SELECT 1 FROM busy WHERE busy.key = k.key) ORDER BY k.i LIMIT 1), \
         ins AS ({} {returning}) \
         SELECT k.i, ins.fence, NULL::text, NULL::bigint, {granted_clock} \
         FROM ins JOIN k USING (key) \
         UNION ALL {busy_rows} WHERE NOT EXISTS (SELECT 1 FROM ins)",
        head(""),
        upsert(t, &format!("{} FROM pick p", row("p.key")), take_if)
    );
    (all, any)
}

/// What an attempt at one key replied: the fence taken, or the holder and
/// two figures (store clock: ms left and the server clock; observed
/// expiry: the row's version and its holder's TTL).
struct Found {
    fence: Option<i64>,
    owner: Option<String>,
    a: Option<i64>,
    b: Option<i64>,
}

impl Found {
    /// The four columns of `row` from `at` on.
    fn read(row: &PgRow, at: usize) -> Result<Self, sqlx::Error> {
        Ok(Self {
            fence: row.try_get(at)?,
            owner: row.try_get(at + 1)?,
            a: row.try_get(at + 2)?,
            b: row.try_get(at + 3)?,
        })
    }
}

/// The upsert, and the holder read when it is refused (see [`Single`]).
pub(super) async fn acquire(db: &Shared<Pg>, w: Write<'_>) -> DbResult<CasOutcome> {
    let single = &db.dialect.sql.acquire;
    let query = bound(db, w, &single.take);
    let mut conn = db.conn().await?;
    let found = take_or_read(&mut conn, query, &single.holder, w.key.as_str()).await;
    Ok(match conn.finish(found)? {
        Some((sent_at, found)) => judge(db, w, sent_at, found),
        None => unseen(db, w),
    })
}

/// `statement` with the single acquisition's parameters: key, owner,
/// TTL in ms, and in the observed-expiry mode the `(holder, version)`
/// pair a takeover names.
fn bound<'q>(db: &Shared<Pg>, w: Write<'q>, statement: &'q str) -> PgQuery<'q> {
    let Write { key, new, ttl } = w;
    let query = sqlx::query(statement)
        .bind(key.as_str())
        .bind(new.as_str())
        .bind(millis(ttl));
    match &db.observed {
        Some(seen) => {
            let (holder, version) = seen.ready(key.as_str()).unzip();
            query.bind(holder).bind(version)
        }
        None => query,
    }
}

/// A statement with its parameters bound.
type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// Runs `take`; when it is refused, reads who holds `key` with `holder`.
/// Returns what the last statement found and when it was sent; `None`
/// when refused and no holder was seen.
async fn take_or_read(
    conn: &mut PgConnection,
    take: PgQuery<'_>,
    holder: &str,
    key: &str,
) -> Result<Option<(Instant, Found)>, sqlx::Error> {
    let sent_at = Instant::now();
    if let Some(row) = take.fetch_optional(&mut *conn).await? {
        let found = Found {
            fence: row.try_get(0)?,
            owner: None,
            a: None,
            b: row.try_get(1)?,
        };
        return Ok(Some((sent_at, found)));
    }
    let sent_at = Instant::now();
    let row = sqlx::query(holder)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let found = Found {
        fence: None,
        owner: row.try_get(0)?,
        a: row.try_get(1)?,
        b: row.try_get(2)?,
    };
    Ok(Some((sent_at, found)))
}

/// The single acquisition by `statement` (one built by [`single`]).
pub(super) async fn run(db: &Shared<Pg>, w: Write<'_>, statement: &str) -> DbResult<CasOutcome> {
    let query = bound(db, w, statement);
    let mut conn = db.conn().await?;
    let sent_at = Instant::now();
    let row = query.fetch_optional(&mut *conn).await;
    Ok(match conn.finish(row)? {
        Some(row) => judge(db, w, sent_at, Found::read(&row, 0)?),
        None => unseen(db, w),
    })
}

/// The outcome of a reply to a request sent at `sent_at`: feeds the store
/// clock, and in the observed-expiry mode records the hold seen (or
/// forgets the key taken).
fn judge(db: &Shared<Pg>, w: Write<'_>, sent_at: Instant, f: Found) -> CasOutcome {
    let key = w.key.as_str();
    if let (None, Some(now_us)) = (&db.observed, f.b) {
        saw_clock(db, sent_at, now_us);
    }
    if let Some(f) = f.fence {
        if let Some(seen) = &db.observed {
            seen.forget(key);
        }
        return CasOutcome::Acquired { fence: fence(f) };
    }
    let held = match &db.observed {
        None => Held {
            holder: f.owner.map(Token::from_stored),
            expires_in: left_ms(f.a),
            revision: None,
        },
        Some(seen) => {
            let owner = f.owner.unwrap_or_default();
            let held_ttl = left_ms(f.b).unwrap_or(w.ttl);
            let left = seen.saw(key, owner.clone(), f.a.unwrap_or_default(), held_ttl);
            Held {
                holder: Some(Token::from_stored(owner)),
                expires_in: Some(left),
                revision: None,
            }
        }
    };
    CasOutcome::Held(held)
}

/// A refused attempt that saw no holder (the hold ended, or began after
/// the statement's snapshot).
fn unseen(db: &Shared<Pg>, w: Write<'_>) -> CasOutcome {
    if let Some(seen) = &db.observed {
        seen.forget(w.key.as_str());
    }
    CasOutcome::Held(Held::default())
}

/// One statement for the whole batch, run again while it loses a race
/// for a key (see the module docs).
pub(super) async fn acquire_many(db: &Shared<Pg>, m: Multi<'_>) -> DbResult<MultiOutcome> {
    for n in 1..=ATTEMPTS {
        if let Some(outcome) = attempt(db, m, n == ATTEMPTS).await? {
            return Ok(outcome);
        }
    }
    Err(Error::store(
        Pg::NAME,
        "the keys of a batch kept being taken under it",
        true,
    )
    .into())
}

/// One run of the batch statement; `None` when it lost a race and must
/// run again (an `Any` reports its last run as it is).
async fn attempt(db: &Shared<Pg>, m: Multi<'_>, last: bool) -> DbResult<Option<MultiOutcome>> {
    let keys: Vec<&str> = m.keys.iter().map(|k| k.as_str()).collect();
    let sql = &db.dialect.sql;
    let statement = match m.mode {
        MultiMode::All => &sql.take_all,
        MultiMode::Any => &sql.take_any,
    };
    let mut query = sqlx::query(statement)
        .bind(&keys)
        .bind(m.new.as_str())
        .bind(millis(m.ttl));
    if let Some(seen) = &db.observed {
        let (holders, versions): (Vec<_>, Vec<_>) =
            keys.iter().map(|k| seen.ready(k).unzip()).unzip();
        query = query.bind(holders).bind(versions);
    }
    let mut conn = db.conn().await?;
    let sent_at = Instant::now();
    let rows = query.fetch_all(&mut *conn).await;
    let rows = match conn.finish(rows) {
        Err(sqlx::Error::Database(e)) if e.message().contains(RACED) => return Ok(None),
        other => other?,
    };
    let mut found = Vec::with_capacity(rows.len());
    for row in &rows {
        let i: i64 = row.try_get(0)?;
        let i = usize::try_from(i - 1).unwrap_or(usize::MAX);
        if i < m.keys.len() {
            found.push((i, Found::read(row, 1)?));
        }
    }
    let raced = match m.mode {
        // Free keys were taken under it: no key reported at all.
        MultiMode::All => found.is_empty(),
        // The key it picked was taken under it: nothing taken, and a key
        // reported neither taken nor busy.
        MultiMode::Any => {
            found.len() < m.keys.len() && found.iter().all(|(_, f)| f.fence.is_none())
        }
    };
    if raced && (m.mode == MultiMode::All || !last) {
        return Ok(None);
    }
    let mut t = Tally::new(m.mode);
    for (i, key) in m.keys.iter().enumerate() {
        let w = m.write(key);
        match found.iter().position(|(j, _)| *j == i) {
            Some(at) => t.add(i, judge(db, w, sent_at, found.swap_remove(at).1)),
            // Every key of an `Any` is reported; one no holder was seen of
            // lost a race.
            None if m.mode == MultiMode::Any && raced => t.add(i, unseen(db, w)),
            None => false,
        };
    }
    Ok(Some(t.finish()))
}
