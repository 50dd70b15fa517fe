//! `moltlock revoke`: remove a key's current holder, owner-checked, or
//! (`--ask`) ask it to release.

use clap::Args;
use moltlock::{Error, LockManager};

use crate::exit::{EXIT_BUSY, EXIT_OK};

/// Options of `moltlock revoke`.
#[derive(Args, Debug)]
pub struct RevokeArgs {
    /// The key whose holder to remove (as `moltlock status` lists it; the
    /// slot keys of a semaphore or read-write lock too).
    #[arg(long)]
    key: String,
    /// Ask the holder to release instead of removing it: nothing is taken
    /// away, and a holder that listens hears of it at its next renewal (a
    /// `moltlock run` or `moltlock elect` of one plain key then stops its
    /// command with SIGTERM, gives it --grace, and releases). Status 0
    /// says the request was written, not that anyone listens.
    #[arg(long)]
    ask: bool,
}

/// Reads the holder of the key and deletes by its token, so a newer holder
/// is never removed. Status 0 when a holder was removed, 75 when the key
/// was free (or changed hands meanwhile: run it again to remove the new
/// holder).
pub async fn revoke(url: &str, args: RevokeArgs) -> Result<u8, Error> {
    let manager = LockManager::new(moltlock::connect(url).await?);
    if args.ask {
        return ask(&manager, &args.key).await;
    }
    match manager.revoke(&args.key).await? {
        Some(holder) => {
            let fence = holder.fence.map_or_else(|| "?".into(), |f| f.to_string());
            let who = holder.description.as_deref().unwrap_or("no description");
            println!("revoked {} (fence {fence}, {who})", args.key);
            Ok(EXIT_OK)
        }
        None => {
            eprintln!("moltlock: {} has no holder to revoke", args.key);
            Ok(EXIT_BUSY)
        }
    }
}

/// Asks the holder of `key` to release it. Status 0 when a holder was
/// asked, 75 when the key was free.
async fn ask(manager: &LockManager, key: &str) -> Result<u8, Error> {
    match manager.request_release(key).await? {
        Some(holder) => {
            let fence = holder.fence.map_or_else(|| "?".into(), |f| f.to_string());
            let who = holder.description.as_deref().unwrap_or("no description");
            println!("asked the holder of {key} to release (fence {fence}, {who})");
            Ok(EXIT_OK)
        }
        None => {
            eprintln!("moltlock: {key} has no holder to ask");
            Ok(EXIT_BUSY)
        }
    }
}
