//! `moltlock status`: who holds what.

use clap::Args;
use moltlock::{Error, HolderInfo};
use serde::Serialize;

use crate::{colour, duration, paint, EXIT_OK};

/// Options of `moltlock status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only keys that start with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    key: String,
    fence: Option<u64>,
    expires_in_ms: Option<u64>,
    holder: String,
}

impl From<&HolderInfo> for Row {
    fn from(h: &HolderInfo) -> Self {
        Self {
            key: h.key.clone(),
            fence: h.fence.map(|f| f.get()),
            expires_in_ms: h
                .expires_in
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            holder: h.holder.as_str().chars().take(8).collect(),
        }
    }
}

/// Prints the current holders under the prefix; for a migration URL, those
/// of both stores.
pub async fn status(url: &str, args: StatusArgs) -> Result<u8, Error> {
    let on = colour(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let Some((phase, old, new)) = moltlock::parse_migration(url)? else {
        let rows = holders(url, &args.prefix).await?;
        if args.json {
            println!("{}", json(&rows)?);
        } else {
            print!("{}", table(&rows, on));
        }
        return Ok(EXIT_OK);
    };
    let (old_rows, new_rows) = (
        holders(&old, &args.prefix).await?,
        holders(&new, &args.prefix).await?,
    );
    if args.json {
        let doc = serde_json::json!({
            "phase": format!("{phase:?}").to_lowercase(),
            "old": old_rows,
            "new": new_rows,
        });
        println!("{}", json(&doc)?);
        return Ok(EXIT_OK);
    }
    println!("migration phase: {phase:?}");
    println!(
        "{}",
        paint(
            &format!("old store ({}):", moltlock::redact_url(&old)),
            "1",
            on
        )
    );
    print!("{}", table(&old_rows, on));
    println!(
        "{}",
        paint(
            &format!("new store ({}):", moltlock::redact_url(&new)),
            "1",
            on
        )
    );
    print!("{}", table(&new_rows, on));
    Ok(EXIT_OK)
}

async fn holders(url: &str, prefix: &str) -> Result<Vec<Row>, Error> {
    let backend = moltlock::connect(url).await?;
    Ok(backend.list(prefix).await?.iter().map(Row::from).collect())
}

fn json(value: &impl Serialize) -> Result<String, Error> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Config(e.to_string()))
}

fn table(rows: &[Row], on: bool) -> String {
    if rows.is_empty() {
        return "no locks held\n".to_owned();
    }
    let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
    let mut out = format!(
        "{}\n",
        paint(
            &format!("{:width$}  {:>10}  {:>9}  HOLDER", "KEY", "FENCE", "LEFT"),
            "1",
            on
        )
    );
    for r in rows {
        let fence = r.fence.map(|f| f.to_string()).unwrap_or_else(|| "-".into());
        let left = r
            .expires_in_ms
            .map(|ms| duration::format(std::time::Duration::from_millis(ms)))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:width$}  {fence:>10}  {left:>9}  {}…\n",
            r.key, r.holder
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lines_up() {
        let rows = vec![Row {
            key: "jobs/a".into(),
            fence: Some(42),
            expires_in_ms: Some(29_500),
            holder: "abcdef12".into(),
        }];
        let t = table(&rows, false);
        assert!(t.starts_with("KEY   "), "{t}");
        assert!(
            t.contains("jobs/a          42      29.5s  abcdef12…"),
            "{t}"
        );
        assert_eq!(table(&[], false), "no locks held\n");
    }
}
