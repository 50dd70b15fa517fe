//! A MoltLock backend on plain files: one directory, one file per held key,
//! and an OS file lock around every read-modify-write, so processes on one
//! machine share locks. Expiry follows the machine's clock (the "store clock"
//! every process here shares).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moltlock_core::{async_trait, Backend, CasOutcome, Error, Fence, Held, LockKey, Token};

/// Locks stored as files under one directory.
#[derive(Clone, Debug)]
pub struct FileBackend {
    dir: PathBuf,
}

impl FileBackend {
    /// Uses `dir` (created if missing) for lock files.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err)?;
        Ok(Self { dir })
    }

    /// Runs `f` on the store while holding the directory's OS lock.
    async fn locked<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Path) -> io::Result<T> + Send + 'static,
    ) -> Result<T, Error> {
        let dir = self.dir.clone();
        let job = move || {
            let guard = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(".lock"))?;
            guard.lock()?;
            let out = f(&dir);
            guard.unlock()?;
            out
        };
        tokio::task::spawn_blocking(job)
            .await
            .map_err(|e| Error::store("file", e, false))?
            .map_err(io_err)
    }
}

fn io_err(e: io::Error) -> Error {
    Error::store("file", e, true)
}

fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// The clock in whole ms, rounded down: a hold is live while this is below
/// its expiry.
fn now_ms() -> u128 {
    since_epoch().as_millis()
}

/// When a hold written now for `ttl` expires, in ms rounded up: it stays
/// live until the whole TTL has passed, never a fraction of a ms less.
fn expiry_ms(ttl: Duration) -> u128 {
    let at = since_epoch().checked_add(ttl).unwrap_or(Duration::MAX);
    at.as_nanos().div_ceil(1_000_000)
}

/// The file of a key: its UTF-8 bytes in hex, so any valid key is a valid name.
fn path(dir: &Path, key: &LockKey) -> PathBuf {
    let name: String = key.as_str().bytes().map(|b| format!("{b:02x}")).collect();
    dir.join(name)
}

/// The live holder of a key file: (token, fence, expires at in ms).
fn read(file: &Path) -> io::Result<Option<(String, u64, u128)>> {
    let text = match fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut parts = text.split(' ');
    let (Some(token), Some(fence), Some(exp)) = (parts.next(), parts.next(), parts.next()) else {
        return Ok(None);
    };
    let (fence, exp) = (fence.parse().unwrap_or(0), exp.parse().unwrap_or(0));
    Ok((exp > now_ms()).then(|| (token.to_owned(), fence, exp)))
}

/// The next fence: one more than the last, kept in `.fence`.
fn next_fence(dir: &Path) -> io::Result<u64> {
    let file = dir.join(".fence");
    let last: u64 = fs::read_to_string(&file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    fs::write(&file, (last + 1).to_string())?;
    Ok(last + 1)
}

#[async_trait]
impl Backend for FileBackend {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        let (key, expected, new) = (key.clone(), expected.cloned(), new.clone());
        self.locked(move |dir| {
            let file = path(dir, &key);
            let current = read(&file)?;
            if current.as_ref().map(|c| c.0.as_str()) != expected.as_ref().map(Token::as_str) {
                let holder = current.map(|c| Token::from_stored(c.0));
                return Ok(CasOutcome::Held(Held {
                    holder,
                    ..Held::default()
                }));
            }
            let fence = match current {
                Some((token, fence, _)) if token == new.as_str() => fence,
                _ => next_fence(dir)?,
            };
            let expires = expiry_ms(ttl);
            File::create(&file)?;
            fs::write(&file, format!("{new} {fence} {expires}"))?;
            Ok(CasOutcome::Acquired {
                fence: Fence(fence),
            })
        })
        .await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        let (key, owner) = (key.clone(), owner.clone());
        self.locked(move |dir| {
            let file = path(dir, &key);
            let ours = read(&file)?.is_some_and(|c| c.0 == owner.as_str());
            if ours {
                fs::remove_file(&file)?;
            }
            Ok(ours)
        })
        .await
    }

    fn name(&self) -> &'static str {
        "file"
    }

    fn limits(&self) -> moltlock_core::Limits {
        // Hex doubles the length; most file systems allow 255-byte names.
        moltlock_core::Limits::new().with_max_key_len(120)
    }
}
