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

/// Prints the current holders under the prefix.
pub async fn status(url: &str, args: StatusArgs) -> Result<u8, Error> {
    let backend = moltlock::connect(url).await?;
    let holds = backend.list(&args.prefix).await?;
    let rows: Vec<Row> = holds.iter().map(Row::from).collect();
    if args.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| Error::Config(e.to_string()))?;
        println!("{text}");
        return Ok(EXIT_OK);
    }
    print!(
        "{}",
        table(
            &rows,
            colour(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        )
    );
    Ok(EXIT_OK)
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
