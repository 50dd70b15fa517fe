//! Read-write locks: readers share, a writer excludes everyone, writers
//! are not starved, a dead reader frees only its own slot.

use moltlock_core::{RwLock, RwOptions};

use super::common::*;

/// A read-write lock of 4 readers named `name`, on a manager of its own.
fn rw(b: &Arc<dyn Backend>, ttl: Duration, name: &str) -> Result<RwLock, String> {
    manager(b, ttl)?
        .rw_lock(name, RwOptions::new().readers(4))
        .map_err(err)
}

/// Readers and writers inside at once.
#[derive(Clone, Default)]
struct Mixed {
    readers: Arc<AtomicU64>,
    writers: Arc<AtomicU64>,
    violations: Arc<AtomicU64>,
    most_readers: Arc<AtomicU64>,
}

impl Mixed {
    fn read(&self) {
        let r = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(r, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn write(&self) {
        let w = self.writers.fetch_add(1, Ordering::SeqCst);
        if w > 0 || self.readers.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, writer: bool) {
        let count = if writer { &self.writers } else { &self.readers };
        count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Several readers hold at once; 2 clients × 6 tasks of mixed reads and
/// writes never see a writer beside anyone; writer fences rise.
pub async fn rw_readers_share_and_writer_excludes(f: Factory) -> CaseResult {
    let name = key("rw-mixed");
    let first = rw(&f.open().await?, LONG, &name)?;
    let shared = [
        first.read().await.map_err(err)?,
        first.read().await.map_err(err)?,
    ];
    ensure!(
        first.try_write().await.map_err(err)?.is_none(),
        "a writer got in beside two readers"
    );
    drop(shared);
    let mixed = Mixed::default();
    let fences: Arc<Mutex<Vec<Fence>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let lock = rw(&f.open().await?, LONG, &name)?;
        for t in 0..6u64 {
            let (lock, mixed, fences) = (lock.clone(), mixed.clone(), fences.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..6u64 {
                    let writer = (t + round) % 3 == 0;
                    rw_round(&lock, &mixed, &fences, writer).await?;
                }
                Ok::<(), String>(())
            }));
        }
    }
    for t in tasks {
        t.await.map_err(|e| format!("a task panicked: {e}"))??;
    }
    let v = mixed.violations.load(Ordering::SeqCst);
    ensure!(v == 0, "{v} times a writer was inside beside someone");
    ensure!(
        mixed.most_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared the lock"
    );
    let fences = fences.lock().map(|f| f.clone()).unwrap_or_default();
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "writer fences did not rise from writer to writer: {fences:?}"
    );
    Ok(Outcome::Passed)
}

async fn rw_round(
    lock: &RwLock,
    mixed: &Mixed,
    fences: &Mutex<Vec<Fence>>,
    writer: bool,
) -> Result<(), String> {
    if writer {
        let w = lock.write().await.map_err(err)?;
        mixed.write();
        if let Ok(mut f) = fences.lock() {
            f.push(w.fence());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        mixed.leave(true);
        w.release().await.map_err(err)
    } else {
        let r = lock.read().await.map_err(err)?;
        mixed.read();
        tokio::time::sleep(Duration::from_millis(4)).await;
        mixed.leave(false);
        r.release().await.map_err(err)
    }
}

/// Once a writer waits, new readers wait behind it, even after several
/// TTLs (its claim is renewed), so a writer waits only for the reads
/// already in progress.
pub async fn rw_writer_is_not_starved(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let name = key("rw-starve");
    let first = rw(&b, ttl, &name)?;
    let reading = first.read().await.map_err(err)?;
    let writer = rw(&f.open().await?, ttl, &name)?;
    let wait = tokio::spawn(async move {
        let opts = moltlock_core::LockOptions::new().timeout(LONG);
        let started = Instant::now();
        let got = writer.write_with(opts).await.map_err(err)?;
        Ok::<_, String>((got, started))
    });
    tokio::time::sleep(ttl + ttl / 2).await;
    let late = rw(&f.open().await?, ttl, &name)?;
    let newcomer = late.try_read().await.map_err(err)?;
    ensure!(
        newcomer.is_none(),
        "a new reader got in while a writer had been waiting for {:?}",
        ttl + ttl / 2
    );
    let released = Instant::now();
    reading.release().await.map_err(err)?;
    let (got, _) = wait
        .await
        .map_err(|e| format!("the writer panicked: {e}"))??;
    ensure!(got.is_some(), "the writer got nothing");
    let after = released.elapsed();
    ensure!(
        after < ttl,
        "the writer got in {after:?} after the last reader left"
    );
    Ok(Outcome::Passed)
}

/// A reader that dies (stops renewing) frees its own slot when its hold
/// expires by the store's clock; a live reader's slot stays held, so the
/// writer still waits for it.
pub async fn rw_dead_reader_frees_only_its_slot(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let ttl = short_ttl(&b);
    let name = key("rw-dead");
    let lock = rw(&b, LONG, &name)?;
    let live = lock.read().await.map_err(err)?;
    let slot = lock_slot_other_than(&name, live.slot());
    let dead = timed_acquire(&f.open().await?, &slot, ttl).await?;
    tokio::time::sleep_until(dead.surely_gone()).await;
    ensure!(
        becomes_free(&b, &slot, Duration::ZERO).await?,
        "the dead reader's slot {slot} was still held after its TTL"
    );
    ensure!(live.is_held(), "the live reader lost its slot");
    let writer = rw(&f.open().await?, LONG, &name)?;
    ensure!(
        writer.try_write().await.map_err(err)?.is_none(),
        "a writer got in beside a live reader"
    );
    live.release().await.map_err(err)?;
    let w = writer
        .write_with(moltlock_core::LockOptions::new().timeout(LONG))
        .await
        .map_err(err)?;
    ensure!(
        w.is_some(),
        "the writer did not get in once the reader left"
    );
    Ok(Outcome::Passed)
}

/// The key of reader slot `0` or `1` of a 4-reader lock, whichever is not `taken`.
fn lock_slot_other_than(name: &str, taken: u32) -> String {
    let slot = if taken == 0 { 1 } else { 0 };
    format!("{name}{}r{slot}", moltlock_core::RESERVED_MARK)
}

/// A writer cancelled while it waits for a reader (holding the writer key
/// and perhaps some slots) leaves nothing held: readers fill every slot.
pub async fn rw_cancelled_writer_leaves_nothing(f: Factory) -> CaseResult {
    let b = f.open().await?;
    let name = key("rw-cancel");
    let lock = rw(&b, LONG, &name)?;
    let reader = lock.read().await.map_err(err)?;
    let writer = rw(&f.open().await?, LONG, &name)?;
    let dropped = tokio::time::timeout(Duration::from_millis(150), writer.write()).await;
    ensure!(dropped.is_err(), "a writer got in beside a reader");
    reader.release().await.map_err(err)?;
    moltlock_core::wait_for_cleanups(LONG).await;
    let after = rw(&f.open().await?, LONG, &name)?;
    let mut readers = Vec::new();
    for i in 0..4 {
        let r = after
            .read_with(moltlock_core::LockOptions::new().timeout(LONG))
            .await
            .map_err(|e| format!("reader {i} of 4 after the writer was cancelled: {e}"))?;
        ensure!(r.is_some(), "reader {i} of 4 got no slot");
        readers.push(r);
    }
    Ok(Outcome::Passed)
}
