//! The Postgres statements of one table, built once from validated names.

use moltlock_core::Error;

use crate::config::{Expiry, SqlConfig};

/// The server clock in microseconds since the epoch, as replies report it.
const NOW_US: &str = "(extract(epoch FROM now()) * 1000000)::bigint";

/// The SQL of one table, built once from validated names.
pub(super) struct Statements {
    pub(super) acquire: String,
    pub(super) renew: String,
    pub(super) transfer: String,
    pub(super) delete: String,
    pub(super) renew_many: String,
    pub(super) raise: String,
    pub(super) sweep: String,
    pub(super) describe: String,
    pub(super) inspect: String,
    pub(super) list: String,
    pub(super) ddl: Vec<String>,
}

/// Adds a column to a table made before it existed. Checked first:
/// `ALTER TABLE` takes the table's strongest lock even when it changes
/// nothing.
fn add_column(t: &str, column: &str, decl: &str) -> String {
    format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute \
         WHERE attrelid = '{t}'::regclass AND attname = '{column}' AND NOT attisdropped) \
         THEN ALTER TABLE {t} ADD COLUMN {column} {decl}; END IF; END $$"
    )
}

impl Statements {
    pub(super) fn new(cfg: &SqlConfig) -> Result<Self, Error> {
        let table = cfg.checked_table()?;
        let schema = cfg.checked_schema()?;
        let q = |name: &str| match schema {
            Some(s) => format!("\"{s}\".\"{name}\""),
            None => format!("\"{name}\""),
        };
        let (t, seq) = (q(table), q(&format!("{table}_fence")));
        let mut ddl = Vec::new();
        if let Some(s) = schema {
            ddl.push(format!("CREATE SCHEMA IF NOT EXISTS \"{s}\""));
        }
        ddl.push(format!("CREATE SEQUENCE IF NOT EXISTS {seq}"));
        let logged = if cfg.unlogged { "UNLOGGED " } else { "" };
        ddl.push(format!(
            "CREATE {logged}TABLE IF NOT EXISTS {t} (\n    key text PRIMARY KEY,\n    owner text NOT NULL,\n    \
             fence bigint NOT NULL,\n    expires_at timestamptz NOT NULL,\n    acquired_at timestamptz NOT NULL,\n    \
             info text,\n    version bigint NOT NULL DEFAULT 0,\n    ttl_ms bigint NOT NULL DEFAULT 0\n)"
        ));
        // Tables made before these columns existed.
        ddl.push(add_column(&t, "info", "text"));
        ddl.push(add_column(&t, "version", "bigint NOT NULL DEFAULT 0"));
        ddl.push(add_column(&t, "ttl_ms", "bigint NOT NULL DEFAULT 0"));
        let observed = cfg.expiry == Expiry::Observed;
        Ok(Self::build(&t, &seq, ddl, observed))
    }

    /// One table serves both expiry modes, so nodes in different modes
    /// contend on the same rows: every write keeps `expires_at` (by the
    /// database clock, for store-clock nodes) and bumps `version` with the
    /// holder's `ttl_ms` (for observed-expiry nodes). The modes differ only
    /// in when a held row may be taken over and in which holds count as
    /// live: store-clock nodes judge by `expires_at`, observed-expiry nodes
    /// only by a released row or the `(owner, version)` pair `($4, $5)` they
    /// watched unchanged for its TTL (see `crate::observe`). A release
    /// clears the owner and sets `expires_at` to the epoch, so a released
    /// key is free whatever the clock does; `acquired_at` then records the
    /// release, for the sweep.
    fn build(t: &str, seq: &str, ddl: Vec<String>, observed: bool) -> Self {
        let ms = "$3::bigint * interval '1 millisecond'";
        let left = "(extract(epoch FROM expires_at - now()) * 1000)::bigint";
        let (take_if, live) = match observed {
            false => ("l.expires_at <= now()", "expires_at > now()"),
            true => (
                "l.owner = '' OR (l.owner = $4 AND l.version = $5)",
                "owner <> ''",
            ),
        };
        let held = match observed {
            false => format!("GREATEST({left}, 0), {NOW_US}"),
            true => "version, ttl_ms".to_owned(),
        };
        let granted_clock = match observed {
            false => NOW_US,
            true => "NULL::bigint",
        };
        let shown_left = match observed {
            false => left.to_owned(),
            true => "NULL::bigint".to_owned(),
        };
        Self {
            // The new fence is drawn in the VALUES row before the conflict is
            // resolved, so a statement that waited on a row lock may carry an
            // older draw than the hold it replaces: `GREATEST` with the row's
            // own last fence keeps fences of the key rising.
            acquire: format!(
                "WITH ins AS (INSERT INTO {t} AS l \
                 (key, owner, fence, expires_at, acquired_at, version, ttl_ms) \
                 VALUES ($1, $2, nextval('{seq}'), now() + {ms}, now(), 1, $3) \
                 ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
                 fence = GREATEST(l.fence + 1, EXCLUDED.fence), info = NULL, \
                 expires_at = EXCLUDED.expires_at, acquired_at = EXCLUDED.acquired_at, \
                 version = l.version + 1, ttl_ms = EXCLUDED.ttl_ms \
                 WHERE {take_if} RETURNING fence) \
                 SELECT fence, NULL::text AS owner, NULL::bigint AS a, {granted_clock} AS b FROM ins \
                 UNION ALL SELECT NULL, owner, {held} FROM {t} \
                 WHERE key = $1 AND owner <> '' AND NOT EXISTS (SELECT 1 FROM ins)"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + {ms}, version = version + 1, ttl_ms = $3 \
                 WHERE key = $1 AND owner = $2 AND {live} RETURNING fence, {NOW_US}"
            ),
            transfer: format!(
                "UPDATE {t} SET owner = $4, fence = GREATEST(fence + 1, nextval('{seq}')), \
                 info = NULL, acquired_at = now(), expires_at = now() + {ms}, \
                 version = version + 1, ttl_ms = $3 \
                 WHERE key = $1 AND owner = $2 AND {live} RETURNING fence, {NOW_US}"
            ),
            delete: format!(
                "WITH d AS (UPDATE {t} SET owner = '', expires_at = 'epoch', acquired_at = now(), \
                 version = version + 1 \
                 WHERE key = $1 AND owner = $2 AND owner <> '' AND {live} RETURNING key) \
                 SELECT count(pg_notify($3, key)) FROM d"
            ),
            renew_many: format!(
                "UPDATE {t} AS l SET expires_at = now() + x.ms * interval '1 millisecond', \
                 version = l.version + 1, ttl_ms = x.ms \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(key, owner, ms) \
                 WHERE l.key = x.key AND l.owner = x.owner AND l.{live} \
                 RETURNING l.key, l.owner, {NOW_US}"
            ),
            // A max on the key's row (a released placeholder when the key has
            // none), and the sequence moved past the floor.
            raise: format!(
                "WITH s AS (SELECT setval('{seq}', GREATEST(last_value, $2)) FROM {seq}) \
                 INSERT INTO {t} AS l (key, owner, fence, expires_at, acquired_at) \
                 SELECT $1, '', $2, 'epoch', now() FROM s \
                 ON CONFLICT (key) DO UPDATE SET fence = GREATEST(l.fence, EXCLUDED.fence)"
            ),
            // Released or expired for the retention, and at or below the
            // sequence: the next `nextval` exceeds the deleted fence. (A
            // fence above the sequence — a stale draw that won through
            // `GREATEST` — keeps its row until the sequence passes it.)
            sweep: format!(
                "DELETE FROM {t} WHERE expires_at < now() - $1::bigint * interval '1 millisecond' \
                 AND acquired_at < now() - $1::bigint * interval '1 millisecond' \
                 AND fence <= (SELECT last_value FROM {seq})"
            ),
            describe: format!(
                "UPDATE {t} SET info = $3 WHERE key = $1 AND owner = $2 AND owner <> '' AND {live}"
            ),
            inspect: format!(
                "SELECT key, owner, fence, {shown_left}, info FROM {t} \
                 WHERE key = $1 AND owner <> '' AND {live}"
            ),
            list: format!(
                "SELECT key, owner, fence, {shown_left}, info FROM {t} \
                 WHERE left(key, length($1)) = $1 AND owner <> '' AND {live} ORDER BY key"
            ),
            ddl,
        }
    }
}
