//! The rows `moltlock status` prints: one per held store key, and the
//! table that groups the derived keys of a semaphore or of a read-write
//! lock under the primitive's name.

use std::collections::BTreeMap;

use moltlock::HolderInfo;
use serde::Serialize;

use crate::derived::{role, Role};
use crate::duration;
use crate::paint::paint;

/// One held store key.
#[derive(Serialize)]
pub struct Row {
    /// The store key.
    pub key: String,
    /// Its fence, where the store keeps it.
    pub fence: Option<u64>,
    /// Time left, in milliseconds.
    pub expires_in_ms: Option<u64>,
    /// The first characters of the holder's token.
    pub holder: String,
    /// The holder's own words.
    pub description: Option<String>,
    /// For a derived key: the semaphore or read-write lock it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// For a derived key: `permit`, `reader` or `writer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// For a permit or reader key: the slot's number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
}

impl From<&HolderInfo> for Row {
    fn from(h: &HolderInfo) -> Self {
        let derived = role(&h.key);
        let (kind, slot) = match derived.map(|(_, r)| r) {
            Some(Role::Permit(i)) => (Some("permit"), Some(i)),
            Some(Role::Reader(i)) => (Some("reader"), Some(i)),
            Some(Role::Writer) => (Some("writer"), None),
            None => (None, None),
        };
        Self {
            key: h.key.clone(),
            fence: h.fence.map(|f| f.get()),
            expires_in_ms: h
                .expires_in
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            holder: h.holder.as_str().chars().take(8).collect(),
            description: h.description.clone(),
            lock: derived.map(|(name, _)| name.to_owned()),
            role: kind,
            slot,
        }
    }
}

/// A line of the table: a heading for a primitive, or a row's cells.
enum Line {
    Heading(String),
    Cells([String; 5]),
}

/// The rows of one semaphore or read-write lock.
#[derive(Default)]
struct Group<'a> {
    permits: Vec<&'a Row>,
    writer: Option<&'a Row>,
    readers: Vec<&'a Row>,
}

/// The table of holders: plain keys first, then each semaphore and
/// read-write lock under its name.
pub fn table(rows: &[Row], on: bool) -> String {
    if rows.is_empty() {
        return "no locks held\n".to_owned();
    }
    let mut lines: Vec<Line> = Vec::new();
    let mut groups: BTreeMap<&str, Group<'_>> = BTreeMap::new();
    for r in rows {
        let Some(name) = r.lock.as_deref() else {
            lines.push(Line::Cells(cells(r, r.key.clone())));
            continue;
        };
        let g = groups.entry(name).or_default();
        match r.role {
            Some("permit") => g.permits.push(r),
            Some("writer") => g.writer = Some(r),
            _ => g.readers.push(r),
        }
    }
    for (name, g) in groups {
        if !g.permits.is_empty() {
            semaphore_lines(name, &g.permits, &mut lines);
        }
        if g.writer.is_some() || !g.readers.is_empty() {
            rw_lines(name, &g, &mut lines);
        }
    }
    render(&lines, on)
}

fn semaphore_lines(name: &str, permits: &[&Row], lines: &mut Vec<Line>) {
    lines.push(Line::Heading(format!(
        "{name}: {} of ? permits in use",
        permits.len()
    )));
    for r in permits {
        let label = format!("  permit {}", r.slot.unwrap_or_default());
        lines.push(Line::Cells(cells(r, label)));
    }
}

/// A read-write lock: its writer and its readers. The slots a writer holds
/// (every reader slot, under one token and without a description) are
/// counted, not listed.
fn rw_lines(name: &str, g: &Group<'_>, lines: &mut Vec<Line>) {
    let mut per_token: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &g.readers {
        *per_token.entry(r.holder.as_str()).or_default() += 1;
    }
    let writers = |r: &&&Row| {
        g.writer.is_some()
            && (r.description.is_none()
                || per_token.get(r.holder.as_str()).copied().unwrap_or(0) > 1)
    };
    let (taken, readers): (Vec<&&Row>, Vec<&&Row>) = g.readers.iter().partition(writers);
    let heading = match (g.writer.is_some(), taken.is_empty(), readers.len()) {
        (true, false, 0) => format!("{name}: held by a writer ({} reader slots)", taken.len()),
        (true, _, 0) => format!("{name}: a writer is getting in"),
        (true, _, n) => format!("{name}: {}, a writer waiting", readers_text(n)),
        (false, _, n) => format!("{name}: {}", readers_text(n)),
    };
    lines.push(Line::Heading(heading));
    if let Some(w) = g.writer {
        lines.push(Line::Cells(cells(w, "  writer".to_owned())));
    }
    for r in readers {
        let label = format!("  reader {}", r.slot.unwrap_or_default());
        lines.push(Line::Cells(cells(r, label)));
    }
}

/// `1 reader`, `3 readers`.
fn readers_text(n: usize) -> String {
    match n {
        1 => "1 reader".to_owned(),
        n => format!("{n} readers"),
    }
}

fn cells(r: &Row, key: String) -> [String; 5] {
    [
        key,
        r.fence.map(|f| f.to_string()).unwrap_or_else(|| "-".into()),
        r.expires_in_ms
            .map(|ms| duration::format(std::time::Duration::from_millis(ms)))
            .unwrap_or_else(|| "-".into()),
        format!("{}…", r.holder),
        r.description.clone().unwrap_or_else(|| "-".into()),
    ]
}

/// Every line, the cells lined up in columns across headings.
fn render(lines: &[Line], on: bool) -> String {
    let head = ["KEY", "FENCE", "LEFT", "HOLDER", "DESCRIPTION"];
    let width = |i: usize| {
        lines
            .iter()
            .filter_map(|l| match l {
                Line::Cells(c) => Some(c[i].chars().count()),
                Line::Heading(_) => None,
            })
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
    for l in lines {
        match l {
            Line::Heading(text) => out.push_str(&paint(text, "1", on)),
            Line::Cells(c) => out.push_str(&line([&c[0], &c[1], &c[2], &c[3], &c[4]])),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use moltlock::{Fence, Token};

    fn row(key: &str, fence: u64, token: &str, description: Option<&str>) -> Row {
        Row::from(&HolderInfo {
            key: key.into(),
            holder: Token::from_stored(token),
            fence: Some(Fence(fence)),
            expires_in: Some(std::time::Duration::from_millis(29_500)),
            description: description.map(str::to_owned),
        })
    }

    #[test]
    fn table_lines_up() {
        let rows = vec![row(
            "jobs/a",
            42,
            "abcdef1234",
            Some("host h pid 7 since 2026-12-01T10:00:00Z: ./report.sh"),
        )];
        let t = table(&rows, false);
        assert!(t.starts_with("KEY   "), "{t}");
        assert!(
            t.contains("jobs/a     42  29.5s  abcdef12…  host h pid 7"),
            "{t}"
        );
        let mut long = row("a", 1_733_000_000_123_456, "abcdef12", None);
        long.expires_in_ms = Some(245_000);
        let mut short = row("bb", 7, "12345678", Some("host h pid 8"));
        short.expires_in_ms = None;
        let t = table(
            &[long, short, row("s#~s1", 3, "99999999", Some("d"))],
            false,
        );
        let ends: Vec<usize> = t
            .lines()
            .filter(|l| !l.contains(" of ? permits"))
            .map(|l| l.rfind("  ").map_or(0, |i| l[..i].chars().count()))
            .collect();
        assert!(ends.windows(2).all(|w| w[0] == w[1]), "misaligned:\n{t}");
        assert!(t.contains("4m05s"), "{t}");
        assert_eq!(table(&[], false), "no locks held\n");
    }

    #[test]
    fn semaphores_show_permits_in_use() {
        let rows = [
            row("jobs", 1, "aaaaaaaa", Some("plain")),
            row("render#~s0", 4, "bbbbbbbb", Some("first")),
            row("render#~s2", 9, "cccccccc", Some("second")),
        ];
        assert_eq!(rows[1].lock.as_deref(), Some("render"));
        assert_eq!((rows[2].role, rows[2].slot), (Some("permit"), Some(2)));
        let t = table(&rows, false);
        assert!(t.contains("render: 2 of ? permits in use\n"), "{t}");
        assert!(t.contains("  permit 0") && t.contains("  permit 2"), "{t}");
        assert!(!t.contains("#~"), "{t}");
        let json = serde_json::to_value(&rows).unwrap_or_default();
        assert_eq!(json[0].get("lock"), None, "plain rows keep their shape");
        assert_eq!(json[2]["slot"], 2);
    }

    #[test]
    fn read_write_locks_show_readers_and_writer() {
        let readers = [
            row("db#~r1", 2, "aaaaaaaa", Some("reader a")),
            row("db#~r5", 3, "bbbbbbbb", Some("reader b")),
        ];
        let t = table(&readers, false);
        assert!(t.contains("db: 2 readers\n"), "{t}");
        assert!(t.contains("  reader 1") && t.contains("  reader 5"), "{t}");
        let writer = [
            row("db#~r0", 4, "cccccccc", None),
            row("db#~r1", 5, "cccccccc", None),
            row("db#~w", 7, "dddddddd", Some("the writer")),
        ];
        let t = table(&writer, false);
        assert!(t.contains("db: held by a writer (2 reader slots)\n"), "{t}");
        assert!(t.contains("  writer") && !t.contains("  reader"), "{t}");
        let waiting = [
            row("db#~r3", 2, "aaaaaaaa", Some("reader a")),
            row("db#~w", 7, "dddddddd", Some("the writer")),
        ];
        let t = table(&waiting, false);
        assert!(t.contains("db: 1 reader, a writer waiting"), "{t}");
    }
}
