//! Which store: the URL from `--url`/`MOLTLOCK_URL`, or the per-user
//! default SQLite file.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The default store's file: `$XDG_STATE_HOME/moltlock/locks.db`, or
/// `~/.local/state/moltlock/locks.db` (only absolute directories count).
pub fn default_path() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| {
        let p = PathBuf::from(v);
        p.is_absolute().then_some(p)
    };
    let base = std::env::var_os("XDG_STATE_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".local").join("state"))
        })?;
    Some(base.join("moltlock").join("locks.db"))
}

/// The default store's URL, if there is a home to put it in.
pub fn default_url() -> Option<String> {
    default_path().map(|p| format!("sqlite://{}", p.display()))
}

/// The file of a `sqlite:` URL (`None` for other stores); an empty path or
/// `:memory:` comes back as it is.
pub fn sqlite_file(url: &str) -> Option<String> {
    let scheme_len = url.find(':')?;
    if !url[..scheme_len].eq_ignore_ascii_case("sqlite") {
        return None;
    }
    let rest = &url[scheme_len + 1..];
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if query
        .split('&')
        .any(|p| p.eq_ignore_ascii_case("mode=memory"))
    {
        return Some(":memory:".to_owned());
    }
    Some(path.to_owned())
}

/// Checks that `url` can lock anything across processes (`run` needs that):
/// no in-memory or nameless SQLite database.
pub fn check_shared(url: &str, default: Option<&str>) -> Result<(), String> {
    match sqlite_file(url).as_deref() {
        Some("" | ":memory:") => Err(format!(
            "{} locks nothing across processes (each process gets its own database): \
             give a file, such as sqlite:///var/lib/app/locks.db, or leave --url out for \
             the per-user default{}",
            moltlock::redact(url),
            default.map(|d| format!(" ({d})")).unwrap_or_default()
        )),
        _ => Ok(()),
    }
}

/// Creates the default store's directory (mode 0700) and file (mode 0600)
/// if they are missing; existing ones are left as they are.
pub fn prepare_default(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_files_are_found() {
        assert_eq!(
            sqlite_file("sqlite:///tmp/x.db").as_deref(),
            Some("/tmp/x.db")
        );
        assert_eq!(sqlite_file("sqlite://./x.db").as_deref(), Some("./x.db"));
        assert_eq!(sqlite_file("sqlite::memory:").as_deref(), Some(":memory:"));
        assert_eq!(
            sqlite_file("sqlite://:memory:").as_deref(),
            Some(":memory:")
        );
        assert_eq!(sqlite_file("sqlite://").as_deref(), Some(""));
        assert_eq!(
            sqlite_file("sqlite://x.db?mode=memory").as_deref(),
            Some(":memory:")
        );
        assert_eq!(sqlite_file("redis://h"), None);
        assert!(check_shared("sqlite::memory:", None).is_err());
        assert!(check_shared("sqlite://", None).is_err());
        assert!(check_shared("sqlite:///tmp/x.db", None).is_ok());
        assert!(check_shared("redis://h", None).is_ok());
    }
}
