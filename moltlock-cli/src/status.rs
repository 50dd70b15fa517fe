//! `moltlock status`: who holds what.

use clap::Args;
use moltlock::{Error, HolderInfo};
use serde::Serialize;

use crate::duration;
use crate::exit::EXIT_OK;
use crate::paint::{colour, paint};

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
    description: Option<String>,
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
            description: h.description.clone(),
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
            println!("store: {}", moltlock::redact_url(url));
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

use moltlock::BackendExt;

async fn holders(url: &str, prefix: &str) -> Result<Vec<Row>, Error> {
    // Looking must not create a store: a SQLite file that is not there (or
    // one in memory) holds no locks.
    if let Some(file) = crate::store::sqlite_file(url) {
        if file.is_empty() || file == ":memory:" || !std::path::Path::new(&file).exists() {
            return Ok(Vec::new());
        }
    }
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
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.key.clone(),
                r.fence.map(|f| f.to_string()).unwrap_or_else(|| "-".into()),
                r.expires_in_ms
                    .map(|ms| duration::format(std::time::Duration::from_millis(ms)))
                    .unwrap_or_else(|| "-".into()),
                format!("{}…", r.holder),
                r.description.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let head = ["KEY", "FENCE", "LEFT", "HOLDER", "DESCRIPTION"];
    let width = |i: usize| {
        cells
            .iter()
            .map(|c| c[i].chars().count())
            .chain([head[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (wk, wf, wl, wh) = (width(0), width(1), width(2), width(3));
    let line = |c: [&str; 5]| {
        let (k, f, l, h, d) = (c[0], c[1], c[2], c[3], c[4]);
        format!("{k:<wk$}  {f:>wf$}  {l:>wl$}  {h:<wh$}  {d}")
    };
    let mut out = format!("{}\n", paint(&line(head), "1", on));
    for c in &cells {
        out.push_str(&line([&c[0], &c[1], &c[2], &c[3], &c[4]]));
        out.push('\n');
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
            description: Some("host h pid 7 since 2026-12-01T10:00:00Z: ./report.sh".into()),
        }];
        let t = table(&rows, false);
        assert!(t.starts_with("KEY   "), "{t}");
        assert!(
            t.contains("jobs/a     42  29.5s  abcdef12…  host h pid 7"),
            "{t}"
        );
        let rows = vec![
            Row {
                key: "a".into(),
                fence: Some(1_733_000_000_123_456),
                expires_in_ms: Some(245_000),
                holder: "abcdef12".into(),
                description: None,
            },
            Row {
                key: "bb".into(),
                fence: Some(7),
                expires_in_ms: None,
                holder: "12345678".into(),
                description: Some("host h pid 8".into()),
            },
        ];
        let t = table(&rows, false);
        let ends: Vec<usize> = t
            .lines()
            .map(|l| l.rfind("  ").map_or(0, |i| l[..i].chars().count()))
            .collect();
        assert!(ends.windows(2).all(|w| w[0] == w[1]), "misaligned:\n{t}");
        assert!(t.contains("4m05s"), "{t}");
        assert_eq!(table(&[], false), "no locks held\n");
    }
}
