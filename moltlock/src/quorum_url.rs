//! `quorum:<url>|<url>|…`: a [`QuorumBackend`] over the stores the URLs
//! name, of any kinds.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::{Backend, ConnectMember, Error, LateMember, Limits, QuorumBackend, Store};

/// The member URLs of a quorum URL, or `None` for another URL.
///
/// # Errors
/// [`Error::Config`] for a quorum URL without members, with an empty
/// member, or with a member that is itself a quorum or a migration.
pub fn parse_quorum(url: &str) -> Result<Option<Vec<String>>, Error> {
    let Some(rest) = strip_prefix_ci(url, "quorum:") else {
        return Ok(None);
    };
    let members: Vec<String> = rest.split('|').map(str::to_owned).collect();
    if members.iter().any(String::is_empty) {
        return Err(Error::Config(
            "a quorum URL is quorum:<store URL>|<store URL>|…, with no empty member".into(),
        ));
    }
    for m in &members {
        if matches!(Store::of(m)?, Store::Quorum | Store::Migrate) {
            return Err(Error::Config(
                "a quorum member is one store, not a quorum or a migration".into(),
            ));
        }
    }
    Ok(Some(members))
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// Connects every member, side by side, and builds the quorum. A member
/// whose store is down (unreachable, or not answering) joins as a
/// [`LateMember`] that connects once its store answers, so a quorum starts
/// while a minority of its stores is down; a bad URL or refused
/// credentials fail at once, as does a majority that cannot be reached.
pub(crate) async fn open_quorum(url: &str) -> Result<Arc<dyn Backend>, Error> {
    let members = parse_quorum(url)?.ok_or_else(|| Error::Config("not a quorum URL".into()))?;
    let mut opening = JoinSet::new();
    for (i, m) in members.iter().enumerate() {
        let m = m.clone();
        opening.spawn(async move { (i, crate::connect_one(&m).await) });
    }
    let mut opened: Vec<Option<Arc<dyn Backend>>> = vec![None; members.len()];
    let mut down = Vec::new();
    while let Some(joined) = opening.join_next().await {
        let (i, result) = joined.map_err(|e| Error::store("quorum", e.to_string(), true))?;
        match result {
            Ok(b) => opened[i] = Some(b),
            Err(e @ (Error::Unavailable { .. } | Error::Timeout { .. })) => down.push((i, e)),
            Err(e) => return Err(e),
        }
    }
    let majority = members.len() / 2 + 1;
    if members.len() - down.len() < majority {
        let (_, e) = down.swap_remove(0);
        return Err(e);
    }
    for (i, e) in down {
        tracing::warn!(member = i, error = %e, "quorum member down; it joins when its store answers");
        opened[i] = Some(late(&members[i])?);
    }
    Ok(Arc::new(QuorumBackend::new(opened.into_iter().flatten())?))
}

/// A member for `url` whose store is down for now.
fn late(url: &str) -> Result<Arc<dyn Backend>, Error> {
    let store = Store::of(url)?;
    let (name, limits) = late_terms(store);
    let url = url.to_owned();
    let connect: ConnectMember = Arc::new(move || {
        let url = url.clone();
        Box::pin(async move { crate::connect_one(&url).await })
    });
    Ok(Arc::new(LateMember::new(name, limits, connect)))
}

/// A down store's backend name and the limits to give it: the store's
/// defaults, and a late write as long as any built-in backend's.
fn late_terms(store: Store) -> (&'static str, Limits) {
    let late_write = Limits::new().with_late_write(Duration::from_secs(15));
    match store {
        #[cfg(feature = "etcd")]
        Store::Etcd => (
            "etcd",
            late_write.with_min_ttl(crate::etcd::MIN_SESSION_TTL),
        ),
        #[cfg(not(feature = "etcd"))]
        Store::Etcd => ("etcd", late_write),
        Store::Redis => ("redis", late_write),
        Store::Postgres => ("postgres", late_write),
        Store::Sqlite => ("sqlite", late_write),
        Store::Mysql => ("mysql", late_write),
        Store::Migrate | Store::Quorum => ("quorum", late_write),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_split_and_checked() {
        let got = parse_quorum("quorum:sqlite:///a.db|sqlite:///b.db|sqlite:///c.db").unwrap();
        assert_eq!(got.map(|m| m.len()), Some(3));
        assert!(parse_quorum("sqlite:///a.db").unwrap().is_none());
        assert!(parse_quorum("quorum:sqlite:///a.db||sqlite:///c.db").is_err());
        assert!(parse_quorum("quorum:quorum:sqlite:///a.db").is_err());
        assert!(parse_quorum("QUORUM:sqlite:///a.db|nope://x").is_err());
    }
}
