//! Holders in words: what a run stores about itself, and how a holder the
//! store reports is shown.

use moltlock::HolderInfo;

use crate::duration;

/// `host h pid p since t: command (abcdef12…, fence f, 12.3s left)`.
pub fn about(h: &HolderInfo) -> String {
    let token: String = h.holder.as_str().chars().take(8).collect();
    let fence = h.fence.map(|f| format!(", fence {f}")).unwrap_or_default();
    let left = h
        .expires_in
        .map(|d| format!(", {} left", duration::format(d)))
        .unwrap_or_default();
    match &h.description {
        Some(d) => format!("{d} ({token}…{fence}{left})"),
        None => format!("{token}…{fence}{left}"),
    }
}

/// What this run stores with its hold: host, pid, start time and command,
/// cut to the description limit.
pub fn describe_self(command: &[String]) -> String {
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let since = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    // The store keeps this text where anyone who can list holds reads it:
    // credentials in the command line stay out.
    let text = format!(
        "host {host} pid {} since {since}: {}",
        std::process::id(),
        moltlock::redact(&command.join(" "))
    );
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut end = clean.len().min(moltlock::MAX_DESCRIPTION_LEN);
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    clean[..end].to_owned()
}
