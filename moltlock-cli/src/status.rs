//! `moltlock status`: who holds what.

use clap::Args;
use moltlock::{BackendExt, Error};
use serde::Serialize;

use crate::exit::EXIT_OK;
use crate::paint::{colour, paint};
use crate::table::{table, Row};

/// Options of `moltlock status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only keys that start with this. The keys of a semaphore or of a
    /// read-write lock start with its name; the table shows them under it
    /// (permits in use; writer and readers), and the JSON rows of such keys
    /// have `lock` (the name), `role` (permit, reader or writer) and `slot`.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
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
