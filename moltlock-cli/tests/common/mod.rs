//! Helpers the CLI's test files share.

use std::path::Path;

use moltlock::BackendExt;

/// An SQLite store in `dir`.
pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// Removes a held store key behind its holder, so the holder's next
/// renewal is refused.
pub fn steal(url: &str, k: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let backend = moltlock::connect(url).await.unwrap();
        let lk: moltlock::LockKey = k.parse().unwrap();
        let info = backend.inspect(&lk).await.unwrap().unwrap();
        assert!(backend.delete(&lk, &info.holder).await.unwrap());
    });
}
