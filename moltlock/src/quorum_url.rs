//! `quorum:<url>|<url>|…`: a [`QuorumBackend`] over the stores the URLs
//! name, of any kinds.

use std::sync::Arc;

use crate::{Backend, Error, QuorumBackend, Store};

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

/// Connects every member and builds the quorum.
pub(crate) async fn open_quorum(url: &str) -> Result<Arc<dyn Backend>, Error> {
    let members = parse_quorum(url)?.ok_or_else(|| Error::Config("not a quorum URL".into()))?;
    let mut backends = Vec::with_capacity(members.len());
    for m in &members {
        backends.push(Box::pin(crate::connect(m)).await?);
    }
    Ok(Arc::new(QuorumBackend::new(backends)?))
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
